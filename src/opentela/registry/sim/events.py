"""The simulator's clock: a heap of (time, sequence, callback, arguments), run in time order.

Ties run in the order they were scheduled (the sequence number), so a run is a pure function of its seed. There is
no cancellation: a timer whose reason has gone (a probe that was answered, a node that died) checks its own state
when it fires, which costs less than keeping handles for the ten thousand timers a second a large run sets.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Simulated time and the events due in it."""

    __slots__ = ("_heap", "_seq", "events_run", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0

    def __repr__(self) -> str:
        return f"<EventLoop t={self.now:.3f} pending={len(self._heap)} run={self.events_run}>"

    def __len__(self) -> int:
        return len(self._heap)

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` at simulated time `when` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, callback, args))

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` `delay` seconds from now."""
        self._seq += 1
        heapq.heappush(self._heap, (self.now + max(0.0, delay), self._seq, callback, args))

    def run_until(self, end: float) -> None:
        """Run every event due up to `end` (inclusive); the clock then reads `end`."""
        heap, pop = self._heap, heapq.heappop
        run = 0
        while heap and heap[0][0] <= end:
            when, _, callback, args = pop(heap)
            self.now = when
            callback(*args)
            run += 1
        self.events_run += run
        self.now = max(self.now, end)

    def next_time(self) -> float | None:
        """When the next event is due (None when nothing is)."""
        return self._heap[0][0] if self._heap else None
