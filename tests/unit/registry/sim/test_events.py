"""The simulator's clock runs events in time order, ties in the order they were scheduled."""

from __future__ import annotations

from opentela.registry.sim.events import EventLoop


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []

    def note(tag: str) -> None:
        seen.append((loop.now, tag))

    loop.call_at(2.0, note, "c")
    loop.call_at(1.0, note, "a")
    loop.call_at(1.0, note, "b")
    loop.call_later(0.5, note, "first")
    loop.run_until(1.5)
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b")]
    assert loop.now == 1.5
    loop.run_until(10.0)
    assert seen[-1] == (2.0, "c") and loop.now == 10.0 and loop.events_run == 4


def test_an_event_may_schedule_more_and_never_in_the_past() -> None:
    loop = EventLoop()
    times: list[float] = []

    def tick(left: int) -> None:
        times.append(loop.now)
        if left:
            loop.call_later(1.0, tick, left - 1)
            loop.call_at(loop.now - 5.0, times.append, -1.0)  # clamped to now: runs next, not before

    loop.call_at(0.0, tick, 2)
    loop.run_until(5.0)
    assert times == [0.0, -1.0, 1.0, -1.0, 2.0]
    assert loop.next_time() is None
