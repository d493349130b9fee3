"""The pipeline-parallel inference simulator: Eq. (1)/(4)/(8) timings, Eq. (5) memory, queueing, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bprr_helpers import instance
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.scheduler.bprr import (
    Hop,
    Instance,
    ModelSpec,
    Placement,
    Route,
    Routing,
    cg_bp,
    mean_token_time,
)
from opentela.scheduler.bprr.sim_events import SimRequest
from opentela.scheduler.bprr.sim_routing import FixedRouter, shortest_router, ws_rr_router
from opentela.scheduler.bprr.simulator import SimConfig, make_requests, poisson_arrivals, simulate


def model(n_blocks: int, output_len: int) -> ModelSpec:
    """Blocks of 10 bytes; one byte of cache per token, so s_c = 1 + output_len (one input token)."""
    return ModelSpec("toy", n_blocks, 10, 1, input_len=1, output_len=output_len)


# Three servers, 4 blocks; server 0 holds [0, 2), server 1 [2, 4), server 2 everything (slow, far).
INST = instance(
    model(4, 9),
    memories=[100, 100, 100],
    taus=[0.01, 0.02, 0.05],
    rtts=[[0.1, 0.2, 0.3]],
    requests=[1],
    prefill=[0.04, 0.08, 0.2],
    input_rtts=[[0.15, 0.25, 0.4]],
)
PLACEMENT = Placement(4, (0, 2, 0), (2, 2, 4))
CHAIN = Route(0, (Hop(0, 0, 2), Hop(1, 2, 4)))


def one_session(
    inst: Instance, route: Route, slots: list[int], setup_s: float = 0.0
) -> tuple[float, float, float]:
    """(first token, each later token, per token) of a lone request on `route`."""
    req = SimRequest(0, 0, 5.0, inst.model.output_len)
    rec = simulate(inst, slots, FixedRouter({0: route}), [req], SimConfig(setup_s=setup_s)).records[0]
    assert rec.start_s == 5.0 and rec.waiting_s == 0.0
    return rec.first_token_time_s, rec.remaining_token_s, rec.per_token_s


def test_single_request_times_are_the_closed_form_of_equations_1_4_and_8() -> None:
    first, later, per_token = one_session(INST, CHAIN, [10, 10, 10])
    # Eq. (1): first token sum_j (t^I_cj + k_j tau^I_j); later tokens sum_j (t_cj + k_j tau_j), i.e. Eq. (4).
    assert first == pytest.approx((0.15 + 2 * 0.04) + (0.25 + 2 * 0.08))
    assert later == pytest.approx((0.1 + 2 * 0.01) + (0.2 + 2 * 0.02))
    # Over all 9 tokens that is Eq. (8), the planner's "all_tokens" objective.
    assert per_token == pytest.approx((first + 8 * later) / 9)
    assert per_token == pytest.approx(mean_token_time(INST, Routing((CHAIN,)), "all_tokens"))
    # A setup constant delays the first token only.
    first_setup, later_setup, _ = one_session(INST, CHAIN, [10, 10, 10], setup_s=60.0)
    assert (first_setup, later_setup) == pytest.approx((first + 60.0, later))


def test_a_single_output_token_has_no_decoding_phase() -> None:
    spec = model(4, 1)
    inst = instance(spec, [100] * 3, [0.01, 0.02, 0.05], [[0.1, 0.2, 0.3]], [1], prefill=[0.04, 0.08, 0.2])
    first, later, per_token = one_session(inst, CHAIN, [10, 10, 10])
    assert later == 0.0 and per_token == pytest.approx(first)


def requests_at(*times: float, output_len: int = 9) -> list[SimRequest]:
    return make_requests(times, output_len)


def test_full_caches_make_requests_wait_in_fifo_order() -> None:
    # Server 0 has room for one session's two caches: sessions must run one after another.
    fifo = simulate(INST, [2, 10, 10], FixedRouter({0: CHAIN}), requests_at(0.0, 0.1, 0.2))
    recs = fifo.records
    duration = recs[0].finish_s - recs[0].start_s
    assert recs[0].waiting_s == 0.0
    assert recs[1].start_s == pytest.approx(recs[0].finish_s)
    assert recs[2].start_s == pytest.approx(recs[1].finish_s)
    assert recs[2].waiting_s == pytest.approx(2 * duration - 0.2)
    assert fifo.peak_used == (2, 2, 0) and fifo.max_in_system == 3
    assert fifo.summary()["waiting_s"] == pytest.approx((0 + duration - 0.1 + 2 * duration - 0.2) / 3)


def test_fifo_head_of_line_blocks_a_smaller_request_behind_it() -> None:
    # Server 2 holds all four blocks and 6 slots. A big session (4 caches) runs; a short small one (2 caches) fits
    # beside it. A second big one then queues, and a small one behind it. When the short session ends, 2 slots
    # free up: enough for the small request but not for the head, so both wait for the first big session.
    big = Route(0, (Hop(2, 0, 4),))
    small = Route(1, (Hop(0, 0, 2), Hop(2, 2, 4)))
    inst = instance(
        model(4, 9), [100] * 3, [0.01, 0.02, 0.05], [[0.1, 0.2, 0.3]] * 2, [1, 1], prefill=[0.04] * 3
    )
    reqs = [
        SimRequest(0, 0, 0.0, 9),
        SimRequest(1, 1, 0.5, 2),  # short
        SimRequest(2, 0, 1.0, 9),
        SimRequest(3, 1, 1.5, 9),
    ]
    res = simulate(inst, [10, 10, 6], FixedRouter({0: big, 1: small}), reqs)
    first, short, head, behind = res.records
    assert short.start_s == 0.5 and behind.request.arrival_s < short.finish_s < first.finish_s
    assert head.start_s == pytest.approx(first.finish_s)
    assert behind.start_s == pytest.approx(head.start_s)
    assert res.peak_used[2] == 6


def test_backoff_admission_retries_after_1_2_4_seconds() -> None:
    # The chain is busy until the first session ends; the second request retries at +1, +3, +7, ... s.
    res = simulate(
        INST, [2, 10, 10], FixedRouter({0: CHAIN}), requests_at(0.0, 0.0), SimConfig(admission="backoff")
    )
    first, second = res.records
    assert first.finish_s < 7.0
    tries = np.cumsum([min(2.0**k, 60.0) for k in range(10)])
    expected = float(tries[np.searchsorted(tries, first.finish_s)])
    assert second.start_s == pytest.approx(expected)
    assert second.retries == int(np.searchsorted(tries, first.finish_s))


def test_a_route_that_can_never_fit_is_rejected_not_queued() -> None:
    res = simulate(INST, [1, 10, 10], FixedRouter({0: CHAIN}), requests_at(0.0, 1.0))
    assert res.rejected == 2 and not res.served
    assert math.isnan(res.mean_token_time_s())


def test_ws_rr_routes_around_a_busy_server_where_shortest_path_waits() -> None:
    # Servers 0 and 1 each hold all 4 blocks and one session; server 0 is a little faster.
    inst = instance(model(4, 9), [100, 100], [0.01, 0.012], [[0.1, 0.1]], [1])
    placement = Placement(4, (0, 0), (4, 4))
    reqs = requests_at(0.0, 0.5)
    blind = simulate(inst, [4, 4], shortest_router(inst, placement, [4, 4]), reqs)
    aware = simulate(inst, [4, 4], ws_rr_router(inst, placement, [4, 4]), reqs)
    assert [r.route.servers for r in blind.records if r.route] == [(0,), (0,)]
    assert blind.records[1].waiting_s > 0
    assert [r.route.servers for r in aware.records if r.route] == [(0,), (1,)]
    assert aware.records[1].waiting_s == 0.0


def test_same_seed_same_run_and_a_new_seed_changes_it() -> None:
    plan = cg_bp(INST, 2)

    def run(seed: int) -> list[tuple[float, float, float]]:
        rng = np.random.default_rng(seed)
        reqs = make_requests(poisson_arrivals(rng, 2.0, 30), 9)
        res = simulate(INST, plan.cache_slots, ws_rr_router(INST, plan.placement, plan.cache_slots), reqs)
        return [(r.start_s, r.first_token_s, r.finish_s) for r in res.records]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_poisson_arrivals_start_at_zero_and_have_the_requested_rate() -> None:
    times = poisson_arrivals(np.random.default_rng(1), 0.5, 4000)
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    assert len(times) / times[-1] == pytest.approx(0.5, rel=0.05)


@st.composite
def loads(draw: st.DrawFn) -> tuple[Instance, list[float], str, str]:
    """A random small deployment, CG-BP placed for a random |R|, and a burst of arrivals that overloads it."""
    n_servers = draw(st.integers(1, 4))
    n_blocks = draw(st.integers(1, 5))
    mems = draw(st.lists(st.integers(20, 200), min_size=n_servers, max_size=n_servers))
    taus = draw(st.lists(st.floats(0.001, 0.05), min_size=n_servers, max_size=n_servers))
    rtts = draw(st.lists(st.floats(0.0, 0.2), min_size=n_servers, max_size=n_servers))
    inst = instance(model(n_blocks, 3), mems, taus, [rtts], [draw(st.integers(1, 6))])
    gaps = draw(st.lists(st.floats(0.0, 0.5), min_size=1, max_size=25))
    router = draw(st.sampled_from(["ws-rr", "shortest"]))
    admission = draw(st.sampled_from(["fifo", "backoff"]))
    return inst, list(np.cumsum(gaps)), router, admission


@settings(max_examples=150, deadline=None)
@given(loads())
def test_memory_never_exceeds_capacity_at_any_event(case: tuple[Instance, list[float], str, str]) -> None:
    inst, times, which, admission = case
    plan = cg_bp(inst)
    if not plan.placement.covers_all():
        return
    make = ws_rr_router if which == "ws-rr" else shortest_router
    config = SimConfig(admission=admission, trace=True)  # type: ignore[arg-type]
    res = simulate(
        inst, plan.cache_slots, make(inst, plan.placement, plan.cache_slots), requests_at(*times), config
    )
    spec = inst.model
    for _, used in res.trace:
        for j, server in enumerate(inst.servers):
            assert used[j] <= plan.cache_slots[j]
            assert (
                spec.block_bytes * plan.placement.counts[j] + spec.cache_bytes * used[j]
                <= server.memory_bytes
            )
    assert res.trace and res.trace[-1][1] == (0,) * len(inst.servers)  # every cache is freed at the end
    for rec in res.records:
        assert rec.rejected or rec.finish_s >= rec.first_token_s >= rec.start_s >= rec.request.arrival_s
    if admission == "fifo":
        starts = [r.start_s for r in res.records if r.served]
        assert starts == sorted(starts)
