"""The compared systems planned and simulated side by side (the benchmark's building block)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opentela.scheduler.bprr import max_guaranteed_concurrency
from opentela.scheduler.bprr.petals import petals_throughput
from opentela.scheduler.bprr.scenarios import A100, MIG, clustered, scattered
from opentela.scheduler.bprr.sim_experiments import (
    SYSTEMS,
    petals_instance,
    run_systems,
    session_concurrency,
    setup_s,
)


def test_planned_concurrency_grows_with_load_and_setup_and_respects_equation_19() -> None:
    inst = clustered(0).instance
    low, high = session_concurrency(inst, 0.1), session_concurrency(inst, 0.5)
    assert 1 <= low < high
    assert session_concurrency(inst, 0.5, setup_s=60.0) > high  # caches are held through the setup too
    assert session_concurrency(inst, 50.0, setup_s=600.0) == max_guaranteed_concurrency(inst)


def test_petals_placement_reads_the_measured_forward_throughput() -> None:
    sc = clustered(0)
    view = petals_instance(sc)
    assert petals_throughput(view, view.servers[0], 53) == pytest.approx(A100.forward_rps / 27)
    assert petals_throughput(view, view.servers[2], 4) == pytest.approx(MIG.forward_rps / 2.5)
    assert view.servers[0].tau_decode_s == sc.instance.servers[0].tau_decode_s


def test_setup_constants_apply_per_system_in_calibrated_mode_only() -> None:
    assert (
        setup_s("proposed", "calibrated")
        < setup_s("opt-number", "calibrated")
        == setup_s("petals", "calibrated")
    )
    assert all(setup_s(s, "model") == 0.0 for s in SYSTEMS)


def test_every_system_serves_the_same_arrivals_deterministically() -> None:
    sc = scattered("AboveNet", 9, 0.2, np.random.default_rng(0), output_len=64)
    a = run_systems(sc, 0.5, 30, np.random.default_rng(1), mode="model")
    b = run_systems(sc, 0.5, 30, np.random.default_rng(1), mode="model")
    assert list(a) == list(SYSTEMS)
    for system in SYSTEMS:
        assert a[system].metrics == b[system].metrics
        assert a[system].metrics["rejected"] == 0
        assert a[system].plan.placement.covers_all()
    # PETALS and 'Optimized RR' share the placement; 'Optimized Number' shares CG-BP's block counts.
    assert a["opt-rr"].plan.placement == a["petals"].plan.placement
    assert a["opt-number"].plan.placement.counts == a["proposed"].plan.placement.counts


def test_under_load_petals_fixed_cache_pool_makes_sessions_wait_and_cg_bp_does_not() -> None:
    # Cluster1, 0.5 req/s, l_max 128 without setup constants: PETALS' 4096-token pools fill, CG-BP's caches fit.
    runs = run_systems(
        clustered(1, 128), 0.5, 100, np.random.default_rng(3), systems=("petals", "proposed"), mode="model"
    )
    petals, proposed = runs["petals"].metrics, runs["proposed"].metrics
    assert petals["waiting_s"] > 10 * max(proposed["waiting_s"], 0.1)
    assert proposed["per_token_s"] < petals["per_token_s"]
    assert not math.isnan(proposed["remaining_token_s"])


def test_an_uncoverable_placement_reports_no_time() -> None:
    sc = scattered("AboveNet", 4, 0.0, np.random.default_rng(0))  # four MIGs hold 16 of 70 blocks
    out = run_systems(sc, 0.1, 5, np.random.default_rng(0), systems=("petals",))
    assert math.isnan(out["petals"].metrics["per_token_s"]) and out["petals"].metrics["rejected"] == 5
