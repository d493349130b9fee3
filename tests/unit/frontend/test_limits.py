"""Budget periods and limit checks: pure arithmetic, no database."""

from __future__ import annotations

import calendar

from hypothesis import given
from hypothesis import strategies as st

from opentela.frontend.limits import (
    BUDGET_PERIODS,
    Consumption,
    Limits,
    check,
    period_end,
    period_start,
    refusal_error,
)

TIMES = st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False)


@given(TIMES, st.sampled_from(["day", "week", "month"]))
def test_now_lies_in_its_period_and_the_next_starts_where_it_ends(now: float, period: str) -> None:
    start, end = period_start(period, now), period_end(period, now)
    assert end is not None and start <= now < end
    assert period_start(period, end) == end


def test_calendar_boundaries() -> None:
    now = calendar.timegm((2026, 12, 31, 15, 0, 0))  # a Thursday
    assert period_start("day", now) == calendar.timegm((2026, 12, 31, 0, 0, 0))
    assert period_start("week", now) == calendar.timegm((2026, 12, 28, 0, 0, 0))  # Monday
    assert period_end("month", now) == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert period_start("total", now) == 0 and period_end("total", now) is None
    assert set(BUDGET_PERIODS) == {"day", "week", "month", "total"}


def test_unlimited_key_is_never_refused() -> None:
    assert check(Limits(), Consumption(10**6, 10**9, 0.0, 10**6, 10**9), 100.0) is None


def test_budget_before_rate_and_the_reset_time() -> None:
    now = calendar.timegm((2026, 5, 10, 12, 0, 0))
    used = Consumption(minute_requests=5, minute_tokens=0, oldest_in_minute=now - 20, period_requests=9)
    limits = Limits(rpm=5, budget_requests=9, budget_period="day")
    refusal = check(limits, used, now)
    assert refusal is not None and refusal.limit == "budget_requests"
    assert refusal.resets_at == calendar.timegm((2026, 5, 11, 0, 0, 0))
    err = refusal_error(refusal, now)
    assert err.status_code == 402 and "2026-05-11T00:00:00Z" in err.message
    rate = check(Limits(rpm=5), used, now)
    assert rate is not None and rate.limit == "requests_per_minute" and rate.resets_at == now + 40
    err = refusal_error(rate, now)
    assert err.status_code == 429 and err.details["retry_after"] == 40


@given(st.integers(0, 50), st.integers(1, 50))
def test_rpm_refuses_exactly_at_the_limit(used: int, limit: int) -> None:
    refusal = check(Limits(rpm=limit), Consumption(minute_requests=used, oldest_in_minute=0.0), 30.0)
    assert (refusal is not None) == (used >= limit)
