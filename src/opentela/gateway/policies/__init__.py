"""Routing policies; built-ins are imported here so registration never depends on import order."""

from opentela.gateway.policies import random_policy as _random_policy  # noqa: F401
from opentela.gateway.policies.base import (
    POLICIES,
    RoutedRequest,
    RoutingPolicy,
    create_policy,
    register_policy,
)

__all__ = ["POLICIES", "RoutedRequest", "RoutingPolicy", "create_policy", "register_policy"]
