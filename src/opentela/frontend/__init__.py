"""The API frontend: API keys, limits, usage metering and the dashboard, in front of an ingress node."""

from opentela.frontend._config import FrontendConfig
from opentela.frontend.server import Frontend, load_or_create_admin_token

__all__ = ["Frontend", "FrontendConfig", "load_or_create_admin_token"]
