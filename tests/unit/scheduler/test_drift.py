"""Workload drift: measuring traffic from usage records, the drift rule, and the tracker's cool-down."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from opentela.bench.traces import TraceRecord
from opentela.errors import ConfigError
from opentela.scheduler.controller import ControllerConfig, FleetController
from opentela.scheduler.drift import DriftRule, Measurement, WorkloadTracker, drift_reasons, measure
from opentela.scheduler.fleet_catalog import parse_fleet_catalog
from opentela.scheduler.workload import LengthDist, Workload

NOW = 1_800_000_000.0
DECLARED = Workload("m", 2.0, LengthDist(500, 100), LengthDist(200, 50))


def usage(
    model: str, rate: float, n: int, input_tokens: int, output_tokens: int = 200, end: float = NOW
) -> list[TraceRecord]:
    """`n` requests evenly spaced at `rate` per second, the last one at `end`."""
    return [
        TraceRecord(end - (n - 1 - i) / rate, model, input_tokens + i % 7, output_tokens) for i in range(n)
    ]


def measured(rate: float, input_median: float, samples: int = 100, output: float = 200) -> Measurement:
    lengths = np.full(samples, input_median)
    w = Workload("m", rate, LengthDist.empirical(lengths), LengthDist.empirical(np.full(samples, output)))
    return Measurement(w, samples)


def test_measure_takes_the_window_rate_and_lengths_per_model() -> None:
    records = usage("m", 2.0, 200, 300) + usage("n", 0.5, 40, 4000, end=NOW - 10)
    old = [TraceRecord(NOW - 7200, "m", 99999, 1)]  # before the window: left out
    got = measure(old + records, window_s=3600, now=NOW)
    assert set(got) == {"m", "n"}
    assert got["m"].samples == 200 and got["m"].workload.rate == pytest.approx(2.0)
    assert got["m"].workload.input.median == pytest.approx(303, abs=1)
    assert got["m"].workload.output.median == 200
    # A model first requested 80 s ago (and quiet for the last 10): its rate over that time, not the hour's.
    assert got["n"].workload.rate == pytest.approx(39 / 88, rel=1e-6)
    assert measure([], window_s=60, now=NOW) == {}


def test_drift_needs_a_large_enough_change() -> None:
    rule = DriftRule(rate=0.3, length=0.5)
    assert drift_reasons(DECLARED, measured(2.5, 700).workload, rule) == []  # +25 % rate, +40 % input
    reasons = drift_reasons(DECLARED, measured(2.7, 32000, output=90).workload, rule)
    assert reasons == [
        "rate 2 -> 2.7 req/s (+35%)",
        "median input 500 -> 32000 tokens (+6300%)",
        "median output 200 -> 90 tokens (-55%)",
    ]
    idle = Workload("m", 0.0, LengthDist(500), LengthDist(200))
    assert drift_reasons(idle, measured(0.1, 500).workload, rule) == ["rate 0 -> 0.1 req/s (new)"]


def test_the_tracker_waits_for_samples_and_for_the_cool_down() -> None:
    tracker = WorkloadTracker([DECLARED], DriftRule(min_samples=30, cooldown_s=600))
    assert tracker.observe({"m": measured(2.0, 32000, samples=29)}, NOW) is None  # too few requests
    assert tracker.observe({"other": measured(9.0, 32000)}, NOW) is None  # not a model it plans
    replan = tracker.observe({"m": measured(2.0, 200)}, NOW)
    assert replan is not None and list(replan.reasons) == ["m"]
    assert replan.describe() == "m: median input 500 -> 200 tokens (-60%)"
    assert tracker.planned["m"] is tracker.adopted["m"] is replan.adopted["m"].workload
    # Within the cool-down a new drift waits; a change within the thresholds is no drift at all.
    assert tracker.observe({"m": measured(2.0, 32000)}, NOW + 599) is None
    assert tracker.observe({"m": measured(2.3, 250)}, NOW + 700) is None
    later = tracker.observe({"m": measured(2.0, 32000)}, NOW + 700)
    assert later is not None and tracker.planned["m"].input.median == 32000


def test_a_first_measurement_replaces_the_declared_traffic() -> None:
    other = Workload("o", 1.0, LengthDist(100), LengthDist(100))
    tracker = WorkloadTracker([DECLARED, other], DriftRule(cooldown_s=600))
    # Within the thresholds of the declared traffic: adopted (its measured shape), with no re-plan.
    close = measured(2.2, 600)
    assert tracker.observe({"m": close}, NOW) is None and tracker.adopted == {"m": close.workload}
    assert tracker.observe({"m": measured(4.0, 600)}, NOW + 1) is not None  # no re-plan yet: no cool-down
    # Another model's first measurement is a re-plan even within the cool-down; the waiting drift of m is not.
    replan = tracker.observe({"m": measured(8.0, 600), "o": measured(1.0, 400)}, NOW + 2)
    assert replan is not None and list(replan.reasons) == ["o"] and set(replan.adopted) == {"o"}
    assert tracker.planned["m"].rate == 4.0


def test_a_replan_adopts_every_model_with_enough_samples() -> None:
    other = Workload("o", 1.0, LengthDist(100), LengthDist(100))
    tracker = WorkloadTracker([DECLARED, other], DriftRule(min_samples=10))
    steady = Measurement(Workload("o", 1.1, LengthDist.empirical([100]), LengthDist.empirical([100])), 50)
    replan = tracker.observe({"m": measured(4.0, 500), "o": steady}, NOW)
    assert replan is not None and list(replan.reasons) == ["m"] and set(replan.adopted) == {"m", "o"}
    assert tracker.planned["o"].rate == 1.1


def test_the_controller_plans_with_adopted_traffic_before_observed_rates() -> None:
    other = Workload("o", 1.0, LengthDist(100), LengthDist(100))

    async def send(peer: str, message: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    fleet = FleetController(ControllerConfig([DECLARED, other]), list, send)
    fleet.observed_rates = {"m": 9.0, "o": 3.0}
    assert [w.rate for w in fleet.workloads()] == [9.0, 3.0]
    replan = fleet.observe_usage({"m": measured(5.0, 8000)}, NOW)
    assert replan is not None
    m, o = fleet.workloads()
    assert (m.rate, m.input.median, o.rate) == (5.0, 8000, 3.0)


def test_drift_settings_come_from_the_catalog() -> None:
    raw = {
        "models": [{"id": "Qwen3-1.7B", "engine": "vllm", "workload": {"rate": 1}}],
        "planning": {
            "usage_window_s": 900,
            "usage_poll_s": 15,
            "drift_rate": 0.2,
            "drift_length": 1.0,
            "drift_min_samples": 100,
            "drift_cooldown_s": 0,
        },
    }
    catalog = parse_fleet_catalog(raw)
    assert (catalog.usage_window_s, catalog.usage_poll_s) == (900, 15)
    assert catalog.controller_config().drift == DriftRule(0.2, 1.0, 100, 0.0)
    assert parse_fleet_catalog({"models": raw["models"]}).drift == DriftRule()
    raw["planning"] = {"drift_cooldown_s": -1}
    with pytest.raises(ConfigError, match="drift_cooldown_s must be >= 0"):
        parse_fleet_catalog(raw)
