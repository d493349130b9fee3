"""Prefix affinity: a conversation's next turn goes to the replica that served its previous one, whose engine
still holds the prefix's KV cache (the paper's Takeaway 5 and its KV-reuse future work).

Each request carries its prompt's prefix digests (`gateway/prompt_prefix.py`). `pick` looks them up from the
longest down in a table of prefix -> replica and takes the first replica that is among the candidates, unless
it has more than `slack` requests in flight beyond the least loaded candidate. Otherwise, and for prompts seen
for the first time, it takes the least loaded candidate, ties going to the replica holding the fewest remembered
prefixes (so new conversations spread even when the ingress is idle), then at random. Every attempt that starts,
whichever policy picked it, ties its prompt to its replica, so the table follows where prefixes really are. The
table is bounded in size (the least recently tied prefixes go first), and entries expire after `ttl` seconds,
when engines have likely evicted the prefix.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from opentela.gateway.policies.base import RoutedRequest, register_policy
from opentela.gateway.policies.least_loaded_policy import LeastLoadedPolicy
from opentela.registry.record import NodeRecord


@register_policy("prefix_affinity")
class PrefixAffinityPolicy:
    """See the module's docstring."""

    name = "prefix_affinity"
    uses_prefix = True
    """Tells the router to compute every request's prefix digests while this policy is loaded."""

    def __init__(
        self,
        *,
        slack: int = 4,
        ttl: float = 600.0,
        entries: int = 65536,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.slack, self.ttl, self.entries = slack, ttl, entries
        self._clock = clock
        self._rng = rng or random.Random()
        self._load = LeastLoadedPolicy(rng=self._rng)
        self._table: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        """Prefix digest -> (session id of the replica that served it last, expiry time)."""
        self._held: dict[str, int] = {}
        """Entries of the table per replica."""
        self.hits = 0
        """Picks that followed a remembered prefix."""
        self.moves = 0
        """Picks that found a prefix's replica overloaded and went elsewhere."""
        self.misses = 0
        """Picks with no remembered prefix among the candidates."""

    @classmethod
    def from_config(cls, config: Any, **options: Any) -> PrefixAffinityPolicy:
        """Built from the gateway's `prefix_affinity_*` settings."""
        return cls(
            slack=config.prefix_affinity_slack,
            ttl=config.prefix_affinity_ttl,
            entries=config.prefix_affinity_entries,
            **options,
        )

    def __repr__(self) -> str:
        return (
            f"<PrefixAffinityPolicy entries={len(self._table)} hits={self.hits} moves={self.moves} "
            f"misses={self.misses}>"
        )

    def stats(self) -> dict[str, int]:
        """Counters for /v1/dnt/stats."""
        self._expire()
        return {"entries": len(self._table), "hits": self.hits, "moves": self.moves, "misses": self.misses}

    def load(self, session_id: str) -> int:
        """Requests this ingress has in flight on a replica."""
        return self._load.load(session_id)

    def replica_of(self, key: bytes) -> str | None:
        """The session a prefix digest is tied to, if it is remembered and not expired."""
        entry = self._table.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._forget(key)
            return None
        return entry[0]

    def pick(self, candidates: Sequence[NodeRecord], request: RoutedRequest) -> NodeRecord:
        """The replica holding the longest remembered prefix, unless overloaded; else the least loaded."""
        prefix = request.prefix
        self._expire()
        if prefix is not None and self._table:
            by_session = {c.session_id: c for c in candidates}
            for key in reversed(prefix.keys):
                target = by_session.get(self.replica_of(key) or "")
                if target is None:
                    continue
                lightest = min(self.load(c.session_id) for c in candidates)
                if self.load(target.session_id) <= lightest + self.slack:
                    self.hits += 1
                    return target
                self.moves += 1
                return self._least_loaded(candidates)
        self.misses += 1
        return self._least_loaded(candidates)

    def _least_loaded(self, candidates: Sequence[NodeRecord]) -> NodeRecord:
        return min(
            candidates,
            key=lambda c: (self.load(c.session_id), self._held.get(c.session_id, 0), self._rng.random()),
        )

    def on_request_start(self, target: NodeRecord, request: RoutedRequest) -> None:
        """Count the request, and tie its prompt to the replica it now runs on."""
        self._load.on_request_start(target, request)
        if request.prefix is None:
            return
        self._expire()
        expires = self._clock() + self.ttl
        for key in request.prefix.remember:
            self._forget(key)
            self._table[key] = (target.session_id, expires)
            self._held[target.session_id] = self._held.get(target.session_id, 0) + 1
        while len(self._table) > self.entries:
            self._forget(next(iter(self._table)))

    def on_request_end(
        self, target: NodeRecord, request: RoutedRequest, *, ok: bool, latency_s: float
    ) -> None:
        """Release its in-flight count; the prefix stays tied (the engine keeps its cache after a failure too,
        and a replica that went away is no candidate, so its entries are skipped until they expire)."""
        self._load.on_request_end(target, request, ok=ok, latency_s=latency_s)

    def _expire(self) -> None:
        # Entries go in at the end with expiry now + ttl, so the oldest, first to expire, are at the front.
        now = self._clock()
        while self._table:
            key, (_, expires) = next(iter(self._table.items()))
            if expires > now:
                return
            self._forget(key)

    def _forget(self, key: bytes) -> None:
        entry = self._table.pop(key, None)
        if entry is not None:
            left = self._held.get(entry[0], 0) - 1
            if left > 0:
                self._held[entry[0]] = left
            else:
                self._held.pop(entry[0], None)
