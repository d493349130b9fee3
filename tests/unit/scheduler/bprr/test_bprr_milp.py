"""The MILP (13) against hand-solved instances, and CG-BPRR against it where the paper's analysis says they meet."""

from __future__ import annotations

import pytest
from bprr_helpers import instance, instances, model
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opentela.scheduler.bprr import (
    Instance,
    cg_bprr,
    lower_bound,
    solution_is_feasible,
    solve_milp,
)


def _three_servers(requests: int) -> Instance:
    # s_m = 10, s_c = 2. a and c hold one block and one cache; b holds both blocks and two caches but is slow.
    return instance(model(2), [12, 24, 12], [0.01, 0.05, 0.01], [[0.1, 0.3, 0.1]], [requests])


def test_milp_finds_the_hand_solved_optimum() -> None:
    plan = solve_milp(_three_servers(1))
    assert plan.status == "optimal" and plan.routing is not None
    # Best chain: a and c one block each, 0.11 + 0.11 (b alone costs 0.3 + 0.1).
    assert plan.mean_token_time_s == pytest.approx(0.22)
    assert sorted(plan.routing.routes[0].servers) == [0, 2]


def test_milp_respects_memory_with_two_requests() -> None:
    """a and c fit one session each, so the second request must take b alone: (0.22 + 0.4) / 2."""
    inst = _three_servers(2)
    plan = solve_milp(inst)
    assert plan.status == "optimal" and plan.routing is not None
    assert plan.mean_token_time_s == pytest.approx(0.31)
    assert solution_is_feasible(inst, plan.placement, plan.routing)


def test_cg_bprr_is_suboptimal_on_the_papers_figure_5_example() -> None:
    """Fig. 5, L = 2: four servers with M = (L + 1) s_m, s_m = L s_c, |R| = L^2 = 4 requests."""
    t, tau, n = 0.1, 0.03, 2
    inst = instance(model(n, block_bytes=20, cache_bytes=10), [60] * 4, [tau] * 4, [[t] * 4], [4])
    greedy = cg_bprr(inst)
    assert greedy.placement.counts == (1, 1, 1, 1)
    assert greedy.mean_token_time_s == pytest.approx(n * (t + tau))  # T^g = L (t + tau)
    best = solve_milp(inst)
    assert best.status == "optimal" and best.mean_token_time_s == pytest.approx(t + n * tau)  # T^o
    assert best.placement.counts == (2, 2, 2, 2)


def test_infeasible_instance_is_reported() -> None:
    inst = instance(model(3), [10, 10], [0.01, 0.01], [[0.1, 0.1]], [1])  # a block, no room for its cache
    assert solve_milp(inst).status == "infeasible"


@st.composite
def whole_model_fits(draw: st.DrawFn) -> Instance:
    """One client; every server holds all L blocks with caches for all |R| requests, so m_j = m_bar_j = L."""
    n, servers, requests = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    memories = [n * (10 + 2 * requests) + draw(st.integers(0, 15)) for _ in range(servers)]
    taus = draw(st.lists(st.floats(0.001, 0.1), min_size=servers, max_size=servers))
    rtts = draw(st.lists(st.floats(0.0, 0.3), min_size=servers, max_size=servers))
    return instance(model(n), memories, taus, [rtts], [requests])


@st.composite
def identical_servers(draw: st.DrawFn) -> Instance:
    """One client, identical servers whose block count does not shrink with |R| and divides L."""
    per, k, requests = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    servers = k + draw(st.integers(0, 1))
    memory = per * (10 + 2 * requests)  # floor(M / (s_m + s_c |R|)) = floor(M / (s_m + s_c)) = per
    assume(memory // 12 == per)
    tau, rtt = draw(st.floats(0.001, 0.1)), draw(st.floats(0.0, 0.3))
    return instance(model(per * k), [memory] * servers, [tau] * servers, [[rtt] * servers], [requests])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.one_of(whole_model_fits(), identical_servers()))
def test_cg_bprr_equals_the_milp_optimum_where_the_bounds_meet(inst: Instance) -> None:
    """CG-BPRR is optimal when Theorem 3.5's upper bound (17) equals Lemma B.1's lower bound (B.8).

    That happens with a single client when line 1's conservative counts equal the most blocks a server can hold
    with one session (m_j = m_bar_j) and the fastest servers tile the model exactly: here, (a) every server holds
    the whole model for all requests, or (b) identical servers whose block count divides L.
    """
    greedy, best = cg_bprr(inst), solve_milp(inst, time_limit_s=60)
    assert greedy.feasible and best.status == "optimal"
    assert greedy.mean_token_time_s == pytest.approx(best.mean_token_time_s, rel=1e-6, abs=1e-9)
    assert greedy.mean_token_time_s == pytest.approx(lower_bound(inst), rel=1e-6, abs=1e-9)


@settings(max_examples=10, deadline=None)
@given(instances(max_servers=3, max_blocks=4, max_clients=2))
def test_shortest_path_routing_is_optimal_under_cg_placement(inst: Instance) -> None:
    """Lemma 3.4: under CG-BP's placement, shortest-path routing solves the routing subproblem (16)."""
    assume(inst.n_requests <= 4)
    greedy = cg_bprr(inst)
    assume(greedy.feasible)
    routed = solve_milp(inst, fixed_placement=greedy.placement, time_limit_s=60)
    assert routed.status == "optimal"
    assert greedy.mean_token_time_s == pytest.approx(routed.mean_token_time_s, rel=1e-6, abs=1e-9)
    full = solve_milp(inst, time_limit_s=60)
    assert full.status == "optimal" and full.mean_token_time_s is not None
    assert lower_bound(inst) - 1e-9 <= full.mean_token_time_s <= greedy.mean_token_time_s + 1e-9
