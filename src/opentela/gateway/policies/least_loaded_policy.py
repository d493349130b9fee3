"""Least loaded: the replica with the fewest requests in flight from this ingress (or fewest pending tokens)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.registry.record import NodeRecord


@register_policy("least_loaded")
class LeastLoadedPolicy:
    """Counts what this ingress has in flight on each replica and picks the lightest; ties break at random.

    With ``by_tokens`` the load is the estimated tokens (prompt plus output) of the requests in flight, so one
    long request weighs more than several short ones.
    """

    name = "least_loaded"

    def __init__(self, by_tokens: bool = False, rng: random.Random | None = None) -> None:
        self.by_tokens = by_tokens
        self._rng = rng or random.Random()
        self.in_flight: dict[str, int] = {}
        self.pending_tokens: dict[str, int] = {}

    def load(self, session_id: str) -> int:
        """The load this policy sees on a replica."""
        table = self.pending_tokens if self.by_tokens else self.in_flight
        return table.get(session_id, 0)

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """The lightest candidate."""
        best: list[NodeRecord] = []
        lowest = -1
        for c in candidates:
            load = self.load(c.session_id)
            if lowest < 0 or load < lowest:
                best, lowest = [c], load
            elif load == lowest:
                best.append(c)
        return best[0] if len(best) == 1 else best[self._rng.randrange(len(best))]

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Count the request against its replica."""
        sid = target.session_id
        self.in_flight[sid] = self.in_flight.get(sid, 0) + 1
        self.pending_tokens[sid] = self.pending_tokens.get(sid, 0) + max(1, request.tokens)

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Release it; replicas with nothing in flight leave the tables, so they stay small under churn."""
        sid = target.session_id
        left = self.in_flight.get(sid, 0) - 1
        tokens = self.pending_tokens.get(sid, 0) - max(1, request.tokens)
        if left <= 0:
            self.in_flight.pop(sid, None)
            self.pending_tokens.pop(sid, None)
        else:
            self.in_flight[sid] = left
            self.pending_tokens[sid] = max(0, tokens)


@register_policy("least_loaded_tokens")
class LeastPendingTokensPolicy(LeastLoadedPolicy):
    """`least_loaded` weighing requests by their estimated tokens (prompt plus output)."""

    name = "least_loaded_tokens"

    def __init__(self, rng: random.Random | None = None) -> None:
        super().__init__(by_tokens=True, rng=rng)
