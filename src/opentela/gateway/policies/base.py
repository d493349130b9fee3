"""The routing policy contract and the registry of policies by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentela.gateway.prompt_prefix import PromptPrefix
from opentela.plugins import Registry
from opentela.registry.record import NodeRecord


@dataclass(slots=True)
class RoutedRequest:
    """What a policy may look at when picking a replica."""

    request_id: str
    model: str
    stream: bool
    body_bytes: int
    attrs: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0
    """Estimated prompt plus output tokens: what the request will cost the replica that serves it."""
    input_tokens: int = 0
    """Estimated prompt tokens (part of `tokens`)."""
    prefix: PromptPrefix | None = None
    """The prompt's prefix digests, when a loaded policy asked for them (`uses_prefix`)."""


class RoutingPolicy(Protocol):
    """Chooses one replica among trust-filtered, healthy candidates and hears when requests start and end."""

    name: str

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord: ...

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None: ...

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None: ...


POLICIES: Registry[type[RoutingPolicy]] = Registry(
    "routing policy",
    builtins=(
        "opentela.gateway.policies.random_policy",
        "opentela.gateway.policies.round_robin_policy",
        "opentela.gateway.policies.weighted_policy",
        "opentela.gateway.policies.least_loaded_policy",
        "opentela.gateway.policies.slo_headroom_policy",
        "opentela.gateway.policies.prefix_affinity_policy",
    ),
    entry_point_group="opentela.routing_policies",
)

register_policy = POLICIES.register
"""Class decorator registering a routing policy under its config name; a duplicate name raises PluginError."""


def create_policy(name: str, config: Any = None, **options: Any) -> RoutingPolicy:
    """Instantiate a built-in policy by name, or an operator's class by `module:Class` import path; a class with
    a `from_config(config, **options)` classmethod is built from the gateway's configuration."""
    cls = POLICIES.get(name)
    from_config = getattr(cls, "from_config", None)
    if config is not None and from_config is not None:
        return from_config(config, **options)  # type: ignore[no-any-return]
    return cls(**options)
