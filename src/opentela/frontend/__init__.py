"""The API frontend: API keys, limits, usage metering and the dashboard, in front of an ingress node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentela.frontend._config import FrontendConfig

if TYPE_CHECKING:
    from opentela.frontend.server import Frontend, load_or_create_admin_token

__all__ = ["Frontend", "FrontendConfig", "load_or_create_admin_token"]


def __getattr__(name: str) -> Any:
    # The configuration tree imports FrontendConfig on every `otela` command; FastAPI, uvicorn and SQLAlchemy load
    # only when a frontend is really built.
    if name in ("Frontend", "load_or_create_admin_token"):
        from opentela.frontend import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
