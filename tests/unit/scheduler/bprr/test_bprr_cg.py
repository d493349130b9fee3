"""CG-BPRR and CG-BP (Alg. 1 and 2): conservative counts, greedy placement, routing, the bound, |R|."""

from __future__ import annotations

import math

import pytest
from bprr_helpers import instance, model

from opentela.scheduler.bprr import (
    Placement,
    amortized_times,
    cg_bp,
    cg_bprr,
    choose_concurrency,
    conservative_counts,
    expected_concurrency,
    lower_bound,
    max_guaranteed_concurrency,
    placement_feasible,
    session_capacity,
    solution_is_feasible,
    theorem_bound,
)


def test_counts_are_sized_for_every_request_through_every_block() -> None:
    # s_m = 10, s_c = 2, |R| = 3: a block with its worst-case caches takes 16.
    inst = instance(model(8), [100, 47, 15, 500], [0.01] * 4, [[0.1] * 4], [3])
    assert conservative_counts(inst, 3) == (6, 2, 0, 8)  # capped at L = 8
    capacity = session_capacity(inst, (6, 2, 0, 8))
    assert capacity[2] == 0 and all(c >= 3 for j, c in enumerate(capacity) if j != 2)  # Eq. (15)
    assert capacity[0] == (100 - 60) // (2 * 6)


def test_fastest_servers_tile_the_model_in_order() -> None:
    """The Remark after Lemma 3.3: server k starts where k-1 ended; the K-th is pushed back to end at L."""
    inst = instance(model(10), [3 * 12, 4 * 12, 5 * 12, 2 * 12], [0.01, 0.02, 0.03, 0.001], [[0.1] * 4], [1])
    counts = conservative_counts(inst, 1)
    assert counts == (3, 4, 5, 2)
    amortized = amortized_times(inst, counts)
    assert sorted(range(4), key=lambda j: amortized[j]) == [0, 1, 2, 3]  # 0.043, 0.045, 0.05, 0.051
    plan = cg_bp(inst)
    # Server 0 takes [0, 3), 1 takes [3, 7), and 2 (K-th, 5 blocks) is pushed back to end at L: [5, 10). Every
    # block is then served (capacity 1 each), so server 3 goes to the first window of least capacity (line 7).
    assert plan.placement == Placement(10, (0, 3, 5, 0), (3, 4, 5, 2))
    assert plan.bound_s == pytest.approx(3 * amortized[0] + 4 * amortized[1] + 5 * amortized[2] - 0.03 * 2)
    plan = cg_bprr(inst)
    assert plan.feasible and plan.routing is not None
    assert plan.routing.routes[0].servers == (0, 1, 2)


def test_servers_beyond_coverage_add_capacity_where_it_is_thinnest() -> None:
    inst = instance(model(4), [24, 24, 36, 24], [0.01, 0.01, 0.5, 0.6], [[0.1] * 4], [1])
    assert conservative_counts(inst, 1) == (2, 2, 3, 2)
    assert session_capacity(inst, (2, 2, 3, 2)) == (1, 1, 1, 1)
    plan = cg_bp(inst)
    # Servers 0 and 1 (fastest) cover [0, 2) and [2, 4). Server 2 (line 7) takes the first least-covered window
    # [0, 3), leaving capacities (2, 2, 2, 1); server 3 then takes [2, 4), the only window holding block 3.
    assert plan.placement.starts == (0, 2, 0, 2)


def test_mean_time_is_within_theorem_3_5_and_above_lemma_b1() -> None:
    inst = instance(
        model(8),
        [50, 60, 80, 200, 30],
        [0.01, 0.02, 0.015, 0.04, 0.005],
        [[0.1, 0.05, 0.2, 0.3, 0.1], [0.2, 0.1, 0.05, 0.05, 0.4]],
        [2, 1],
    )
    plan = cg_bprr(inst)
    assert plan.feasible and plan.routing is not None and plan.mean_token_time_s is not None
    assert solution_is_feasible(inst, plan.placement, plan.routing)
    bound = theorem_bound(inst, plan.placement.counts)
    assert bound is not None and lower_bound(inst) <= plan.mean_token_time_s <= bound + 1e-12


def test_infeasible_when_no_worst_case_placement_covers_the_model() -> None:
    """The first suboptimality example after Alg. 1: s_m + s_c |R| > M_j >= s_m + s_c."""
    inst = instance(model(2), [12] * 8, [0.01] * 8, [[0.1] * 8], [4])
    assert not placement_feasible(inst, 4)
    plan = cg_bprr(inst)
    assert plan.status == "infeasible" and plan.routing is None
    assert placement_feasible(inst, 1) and cg_bp(inst, 1).feasible


def test_max_guaranteed_concurrency_is_equation_19() -> None:
    inst = instance(model(4), [200, 100, 60], [0.01] * 3, [[0.1] * 3], [1])
    r = max_guaranteed_concurrency(inst)
    assert r == (360 - 10 * (4 + 3)) // (2 * (4 + 3))  # 20
    assert placement_feasible(inst, r)  # (19) implies (18)


def test_concurrency_is_mean_plus_one_std_of_arrivals_capped_by_19() -> None:
    assert expected_concurrency(0.5, 8.0) == pytest.approx(4 + 2)
    inst = instance(model(4), [2000, 1000, 600], [0.01] * 3, [[0.1] * 3], [1])
    assert choose_concurrency(inst, 0.5, session_s=8.0) == 6
    assert choose_concurrency(inst, 100.0, session_s=100.0) == max_guaranteed_concurrency(inst)
    # Without a session time, it is the placement's own first session (Eq. 1 on the shortest chain).
    r = choose_concurrency(inst, 0.5)
    assert r >= 1 and r <= max_guaranteed_concurrency(inst)
    assert not math.isnan(r)
