"""Routing policies; `POLICIES` imports the built-ins itself, so registration never depends on import order."""

from opentela.gateway.policies.base import (
    POLICIES,
    RoutedRequest,
    RoutingPolicy,
    create_policy,
    register_policy,
)
from opentela.gateway.policies.least_loaded_policy import LeastLoadedPolicy, LeastPendingTokensPolicy
from opentela.gateway.policies.random_policy import RandomPolicy
from opentela.gateway.policies.round_robin_policy import RoundRobinPolicy
from opentela.gateway.policies.weighted_policy import WeightedPolicy

__all__ = [
    "POLICIES",
    "LeastLoadedPolicy",
    "LeastPendingTokensPolicy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "RoutedRequest",
    "RoutingPolicy",
    "WeightedPolicy",
    "create_policy",
    "register_policy",
]
