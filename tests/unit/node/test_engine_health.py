"""The health verdict: consecutive failures and time since the last passing check, each a fail-stop limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opentela.node.engine_health import HealthVerdict, watch_health


def test_consecutive_failures_reach_the_limit_and_a_pass_resets_them() -> None:
    v = HealthVerdict(failures=3, unhealthy_limit=0, now=0.0)
    assert v.record(False, 1.0) is None
    assert v.record(False, 2.0) is None
    assert v.record(True, 3.0) is None  # recovered: counting starts over
    assert v.record(False, 4.0) is None
    assert v.record(False, 5.0) is None
    assert v.record(False, 6.0) == "engine failed 3 consecutive health checks"


def test_unhealthy_limit_counts_from_the_last_pass() -> None:
    v = HealthVerdict(failures=0, unhealthy_limit=10.0, now=100.0)
    assert v.record(False, 105.0) is None
    assert v.record(True, 108.0) is None
    assert v.record(False, 117.9) is None
    assert v.record(False, 118.0) == "engine unhealthy for 10.0 s (limit 10 s)"


def test_unhealthy_limit_counts_from_the_start_when_no_check_ever_passed() -> None:
    v = HealthVerdict(failures=0, unhealthy_limit=5.0, now=0.0)
    assert v.record(False, 4.0) is None
    assert v.record(False, 5.5) is not None


@given(st.lists(st.booleans(), max_size=50))
def test_both_limits_off_never_fail(results: list[bool]) -> None:
    v = HealthVerdict(failures=0, unhealthy_limit=0, now=0.0)
    assert all(v.record(ok, float(i)) is None for i, ok in enumerate(results))


@given(st.lists(st.booleans(), max_size=50), st.integers(1, 5))
def test_fatal_exactly_when_the_last_n_checks_failed(results: list[bool], n: int) -> None:
    v = HealthVerdict(failures=n, unhealthy_limit=0, now=0.0)
    for i, ok in enumerate(results):
        fatal = v.record(ok, float(i)) is not None
        tail = results[: i + 1][-n:]
        assert fatal == (len(tail) == n and not any(tail))
        if fatal:
            break


async def test_watch_returns_the_reason_once_checks_keep_failing() -> None:
    answers = iter([True, True, False, True, False, False])
    calls = 0

    async def check() -> bool:
        nonlocal calls
        calls += 1
        return next(answers)

    reason = await watch_health(check, interval=0.0, failures=2, unhealthy_limit=0)
    assert reason == "engine failed 2 consecutive health checks"
    assert calls == 6


def test_failures_closer_than_the_spacing_count_once() -> None:
    # Reads every second for the engine's state, health checks every 10 s: the failure limit still counts checks.
    v = HealthVerdict(failures=2, unhealthy_limit=0, now=0.0, spacing=10.0)
    assert v.record(False, 1.0) is None and v.consecutive == 1
    assert all(v.record(False, float(t)) is None for t in range(2, 11))
    assert v.record(False, 11.0) == "engine failed 2 consecutive health checks"
    v = HealthVerdict(failures=2, unhealthy_limit=0, now=0.0, spacing=10.0)
    v.record(False, 1.0)
    assert v.record(True, 5.0) is None and v.record(False, 6.0) is None and v.consecutive == 1


def test_the_unhealthy_limit_is_checked_at_every_read() -> None:
    v = HealthVerdict(failures=0, unhealthy_limit=3.0, now=0.0, spacing=10.0)
    assert v.record(False, 2.0) is None
    assert v.record(False, 3.0) == "engine unhealthy for 3.0 s (limit 3 s)"


async def test_watch_reads_every_state_interval_but_counts_failures_once_per_health_interval() -> None:
    now = 0.0
    calls = 0

    def clock() -> float:
        return now

    async def check() -> bool:
        nonlocal calls, now
        calls += 1
        now += 0.25  # each read advances the clock; the loop's sleeps then last no time
        return False

    reason = await watch_health(check, interval=1.0, failures=3, unhealthy_limit=0, every=0.25, clock=clock)
    assert reason == "engine failed 3 consecutive health checks"
    assert calls == 9  # counted at reads 1, 5 and 9: one second apart, as without the state reads
