"""How far this node can trust its own timeouts: event-loop lag and a local health score.

A failure detector judges others by timeouts, which only means something when its own process runs on time. On an
overloaded host (a node starting beside a hundred others on two cores, a Python process starved of CPU) our own
probes time out because *we* are late, and a plain SWIM member would suspect, then evict, healthy peers; they
rejoin under new sessions and the extra records make the overload worse. Following the idea of Lifeguard's local
health multiplier (Dadgar et al., 2018), a node that sees signs of its own slowness (a stalled event loop during a
probe, having to refute a suspicion of itself) raises a score that stretches its probe and suspicion timeouts, and
a probe that failed while our loop was stalled proves nothing about the peer. Successful probes lower the score.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LocalHealth:
    """A score in [0, limit]: 0 is healthy; timeouts are multiplied by 1 + score. Pure; no clock needed."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.score = 0

    def __repr__(self) -> str:
        return f"<LocalHealth {self.score}/{self.limit}>"

    @property
    def multiplier(self) -> int:
        """Factor on probe timeouts and on the suspicion grace period."""
        return 1 + self.score

    def degrade(self) -> None:
        """A sign that we are the slow one."""
        self.score = min(self.limit, self.score + 1)

    def improve(self) -> None:
        """A probe round went as expected."""
        self.score = max(0, self.score - 1)


class LoopLag:
    """Samples how late the event loop wakes a periodic timer, to tell whether a timeout was ours."""

    def __init__(
        self, interval: float = 0.25, window: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.window = window
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque()  # (time the late tick started, lateness)
        self._tick_started: float | None = None

    def __repr__(self) -> str:
        return f"<LoopLag worst={self.worst_since(self.clock() - self.window):.3f}s>"

    def record(self, started: float, lateness: float) -> None:
        """One tick that began at `started` woke `lateness` seconds after it was due."""
        now = self.clock()
        if lateness > 0:
            self._samples.append((started, lateness))
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()

    def worst_since(self, since: float) -> float:
        """Longest stall of the loop that overlapped [since, now], the stall in progress included."""
        worst = 0.0
        for started, lateness in self._samples:
            if started + self.interval + lateness >= since:
                worst = max(worst, lateness)
        if self._tick_started is not None:
            worst = max(worst, self.clock() - self._tick_started - self.interval)
        return worst

    async def run(self) -> None:
        """Sample forever (cancel to stop)."""
        while True:
            started = self.clock()
            self._tick_started = started
            await asyncio.sleep(self.interval)
            self._tick_started = None
            self.record(started, self.clock() - started - self.interval)
