"""Uniform random choice among candidates: the paper's default."""

from __future__ import annotations

import random
from collections.abc import Sequence

from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.registry.record import NodeRecord


@register_policy("random")
class RandomPolicy:
    """Picks a replica uniformly at random; keeps no state."""

    name = "random"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """Uniform choice."""
        return candidates[self._rng.randrange(len(candidates))]

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Nothing to track."""

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Nothing to track."""
