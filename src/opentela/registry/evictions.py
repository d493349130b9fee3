"""Evictions waiting for evidence: who signed which, per-signer rate limits, and when a hold runs out. Pure.

An eviction (a LEFT record signed by another member than the owner) is terminal in the CRDT: once merged, no
later record of that session can win. So a node merges one only for a session it cannot vouch for: one it
does not hold live, one its own probes also failed to reach, or one a quorum of distinct members evicted. The
rest wait here, are re-checked by the membership driver, and are refused when their hold runs out; a member
that keeps sending unsupported evictions is rate-limited. Held records are not in the replica, so this node
never passes an unsupported eviction on.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

from opentela._types import PeerId, SessionId
from opentela.registry.record import NodeRecord

MAX_HELD = 4096
"""Held evictions across all sessions; beyond it new ones are dropped (each signer is limited well below)."""


class Outcome(enum.Enum):
    """What `EvictionEvidence.hold` did with an eviction."""

    HELD = "held"  # a new (session, signer) pair, now waiting
    UPDATED = "updated"  # a signer's newer eviction of a session it had already evicted
    KNOWN = "known"  # this very record is already held or was refused: nothing new
    RATE_LIMITED = "rate_limited"  # the signer is over its limit: dropped unexamined
    FULL = "full"  # too many held evictions: dropped


class EvictionEvidence:
    """The evictions this node holds, by session and signer, and each signer's recent unsupported ones."""

    def __init__(
        self,
        *,
        quorum: int,
        hold: float,
        signer_limit: int,
        signer_window: float,
        clock: Callable[[], float],
    ) -> None:
        self.quorum = quorum
        self.hold_s = hold
        self.signer_limit = signer_limit
        self.signer_window = signer_window
        self.clock = clock
        self._held: dict[SessionId, dict[PeerId, NodeRecord]] = {}
        self._since: dict[SessionId, float] = {}
        self._recent: dict[PeerId, deque[float]] = {}
        self._refused: dict[bytes, float] = {}  # signature -> until when a re-sent copy is ignored

    def __repr__(self) -> str:
        return f"<EvictionEvidence held={len(self._held)} quorum={self.quorum}>"

    def __len__(self) -> int:
        return sum(len(by_signer) for by_signer in self._held.values())

    def sessions(self) -> list[SessionId]:
        """Sessions with held evictions."""
        return list(self._held)

    def signers(self, session: SessionId) -> set[PeerId]:
        """Distinct members (never the owner) whose evictions of `session` are held."""
        return set(self._held.get(session, ()))

    def has_quorum(self, session: SessionId) -> bool:
        """Whether enough distinct members evicted `session` to merge without evidence of our own."""
        return len(self._held.get(session, ())) >= self.quorum

    def hold(self, record: NodeRecord) -> Outcome:
        """Keep `record` (a verified eviction) until there is evidence for it or its hold runs out."""
        now = self.clock()
        if record.signature in self._refused or record.signature in {
            r.signature for r in self._held.get(record.session_id, {}).values()
        }:
            return Outcome.KNOWN
        recent = self._recent.setdefault(record.signer, deque())
        while recent and recent[0] < now - self.signer_window:
            recent.popleft()
        if len(recent) >= self.signer_limit:
            return Outcome.RATE_LIMITED
        by_signer = self._held.get(record.session_id)
        if by_signer is None and len(self) >= MAX_HELD:
            return Outcome.FULL
        recent.append(now)
        by_signer = self._held.setdefault(record.session_id, {})
        self._since.setdefault(record.session_id, now)
        earlier = by_signer.get(record.signer)
        if earlier is None or earlier.rank < record.rank:
            by_signer[record.signer] = record
        return Outcome.HELD if earlier is None else Outcome.UPDATED

    def held(self, session: SessionId) -> list[NodeRecord]:
        """The held evictions of `session`, one per signer."""
        return list(self._held.get(session, {}).values())

    def take(self, session: SessionId) -> list[NodeRecord]:
        """Release every held eviction of `session` (to merge them, or because the session is gone anyway)."""
        self._since.pop(session, None)
        return list(self._held.pop(session, {}).values())

    def expire(self) -> list[NodeRecord]:
        """Refuse evictions held longer than the hold; re-sent copies of them are ignored for as long again."""
        now = self.clock()
        for signature in [s for s, until in self._refused.items() if until < now]:
            del self._refused[signature]
        for signer in [
            p for p, times in self._recent.items() if not times or times[-1] < now - self.signer_window
        ]:
            del self._recent[signer]
        refused = []
        for session in [s for s, since in self._since.items() if now - since > self.hold_s]:
            for record in self.take(session):
                self._refused[record.signature] = now + self.hold_s
                refused.append(record)
        return refused
