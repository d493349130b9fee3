"""Replica health as this ingress sees it: replicas that fail repeatedly sit out a short cooldown."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentela.registry.record import NodeRecord


@dataclass(slots=True)
class _Streak:
    failures: int = 0
    cooling_until: float = 0.0


class ReplicaHealth:
    """Counts consecutive failed attempts per replica (session); `threshold` in a row cools it for `cooldown` s.

    A success clears the streak. Cooling replicas are left out of routing, unless every candidate is cooling:
    then they are all tried rather than failing the request outright (the fault may have been transient).
    """

    def __init__(
        self, threshold: int = 3, cooldown: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._streaks: dict[str, _Streak] = {}
        self.cooldowns = 0

    def __repr__(self) -> str:
        return (
            f"<ReplicaHealth cooling={self.cooling()} threshold={self.threshold} cooldown={self.cooldown}s>"
        )

    def failed(self, session_id: str) -> bool:
        """Book a failed attempt; True when this failure starts a cooldown."""
        if len(self._streaks) > 4096:
            self._prune()
        streak = self._streaks.setdefault(session_id, _Streak())
        streak.failures += 1
        if self.threshold > 0 and streak.failures >= self.threshold:
            streak.failures = 0
            streak.cooling_until = self._clock() + self.cooldown
            self.cooldowns += 1
            return True
        return False

    def cool(self, session_id: str) -> None:
        """Cool a replica now: it said itself that it cannot serve (its engine is not running)."""
        streak = self._streaks.setdefault(session_id, _Streak())
        streak.failures = 0
        streak.cooling_until = self._clock() + self.cooldown
        self.cooldowns += 1

    def succeeded(self, session_id: str) -> None:
        """Book a success: the streak ends."""
        if self._streaks:
            self._streaks.pop(session_id, None)

    def is_cooling(self, session_id: str) -> bool:
        """Whether the replica is sitting out a cooldown now."""
        streak = self._streaks.get(session_id)
        return streak is not None and streak.cooling_until > self._clock()

    def cooling(self) -> list[str]:
        """Sessions cooling now."""
        now = self._clock()
        return [sid for sid, s in self._streaks.items() if s.cooling_until > now]

    def available(self, candidates: Sequence[NodeRecord]) -> Sequence[NodeRecord]:
        """The candidates not cooling (all of them when every one is)."""
        if not self._streaks:
            return candidates
        now = self._clock()
        kept = [c for c in candidates if not self._cooling_at(c.session_id, now)]
        return kept or candidates

    def _prune(self) -> None:
        # Replicas that failed and then vanished (their sessions never come back) must not pile up.
        now = self._clock()
        self._streaks = {sid: s for sid, s in self._streaks.items() if s.cooling_until > now}

    def _cooling_at(self, session_id: str, now: float) -> bool:
        streak = self._streaks.get(session_id)
        return streak is not None and streak.cooling_until > now
