"""Round robin: each model's replicas take turns, in a stable order."""

from __future__ import annotations

from collections.abc import Sequence

from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.registry.record import NodeRecord


@register_policy("round_robin")
class RoundRobinPolicy:
    """Cycles through the candidates of each model, ordered by session id so the order survives churn."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn: dict[str, int] = {}

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """The next replica in turn for this model."""
        turn = self._turn.get(request.model, 0)
        self._turn[request.model] = turn + 1
        if len(candidates) == 1:
            return candidates[0]
        return sorted(candidates, key=lambda r: r.session_id)[turn % len(candidates)]

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Nothing to track."""

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Nothing to track."""
