"""The synthetic stand-in for the Azure traces has the published statistics it was fitted to, and is seeded."""

from __future__ import annotations

import numpy as np

from opentela.scheduler.llm_mesh.workload import SECONDS_PER_DAY, AzureStandIn, interarrival_cv


def test_the_trace_is_deterministic_for_a_seed() -> None:
    w = AzureStandIn()
    a, b = (w.trace(32, 600, np.random.default_rng(7)) for _ in range(2))
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.input_len, b.input_len)
    c = w.trace(32, 600, np.random.default_rng(8))
    assert len(c) != len(a) or not np.array_equal(a.arrival, c.arrival)


def test_lengths_have_the_conversation_traces_medians_and_means() -> None:
    inp, out = AzureStandIn().lengths(200_000, np.random.default_rng(1))
    assert abs(np.median(inp) - 1020) < 20 and abs(inp.mean() - 1155) < 30
    assert abs(np.median(out) - 129) < 5 and abs(out.mean() - 211) < 8
    assert (inp + out <= 4096).all() and inp.min() >= 1 and out.min() >= 1


def test_rates_are_skewed_like_the_functions_trace_and_scale() -> None:
    w = AzureStandIn()
    rates = w.function_rates(128)
    per_day = rates * SECONDS_PER_DAY
    assert (np.diff(rates) <= 0).all()
    assert per_day.min() >= w.min_rate_per_day and per_day.max() <= w.max_rate_per_day
    assert per_day.max() / per_day.min() > 1000  # orders of magnitude apart
    assert np.allclose(AzureStandIn(rate_scale=2.0).function_rates(128), 2 * rates)


def test_arrivals_are_bursty_at_the_set_cv() -> None:
    times = AzureStandIn().arrivals(1.0, 50_000, np.random.default_rng(3))
    assert abs(len(times) / 50_000 - 1.0) < 0.05
    assert abs(interarrival_cv(times) - 2.0) < 0.15
