"""Weighted random choice: replicas get traffic in proportion to the capacity their records advertise."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.gateway.policies.weights import GPU_CLASS_WEIGHTS, replica_weight
from opentela.registry.record import NodeRecord


@register_policy("weighted")
class WeightedPolicy:
    """Picks a replica at random with probability proportional to `replica_weight` (GPU class, throughput)."""

    name = "weighted"

    def __init__(
        self, rng: random.Random | None = None, gpu_weights: Mapping[str, float] | None = None
    ) -> None:
        self._rng = rng or random.Random()
        self._table = {**GPU_CLASS_WEIGHTS, **(gpu_weights or {})}
        self._cache: dict[tuple[str, int, str], float] = {}

    def weight(self, record: NodeRecord, model: str) -> float:
        """The record's weight for `model`; records are immutable per version, so weights are cached."""
        key = (record.session_id, record.version, model)
        weight = self._cache.get(key)
        if weight is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            weight = self._cache[key] = replica_weight(record, model, self._table)
        return weight

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """A weighted draw."""
        if len(candidates) == 1:
            return candidates[0]
        weights = [self.weight(c, request.model) for c in candidates]
        return self._rng.choices(candidates, weights)[0]

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Nothing to track."""

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Nothing to track."""
