"""The routing policy contract and the registry of policies by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from opentela.errors import ConfigError
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


class RoutingPolicy(Protocol):
    """Chooses one replica among trust-filtered, healthy candidates and hears when requests start and end."""

    name: str

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord: ...

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None: ...

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None: ...


P = TypeVar("P", bound=type)
POLICIES: dict[str, type] = {}


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator registering a policy under `name`; a duplicate name is an error."""

    def deco(cls: P) -> P:
        key = name.lower()
        if key in POLICIES:
            raise ConfigError(f"routing policy {key!r} is already registered by {POLICIES[key].__qualname__}")
        POLICIES[key] = cls
        cls.name = key  # type: ignore[attr-defined]
        return cls

    return deco


def create_policy(name: str, **options: Any) -> RoutingPolicy:
    """Instantiate a built-in policy by name, or an operator's class by `module:Class` import path."""
    if ":" in name:
        import importlib

        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load routing policy {name!r}: {exc}") from exc
        return cls(**options)
    try:
        return POLICIES[name.lower()](**options)
    except KeyError:
        raise ConfigError(
            f"unknown routing policy {name!r}; built-ins: {', '.join(sorted(POLICIES))}"
        ) from None
