"""The BPRR problem: block numbering, Lemma 3.1 feasibility, the cost models (1), (4), (8) and memory (2), (5)."""

from __future__ import annotations

import pytest
from bprr_helpers import instance, model

from opentela.scheduler.bprr import (
    Hop,
    ModelSpec,
    Network,
    Placement,
    Route,
    Routing,
    chain_is_feasible,
    memory_violations,
    route_first_token_time,
    route_from_chain,
    route_token_time,
    route_total_time,
    server_memory,
    solution_is_feasible,
)
from opentela.scheduler.bprr.problem import hop_cost, route_is_valid


def test_placement_maps_to_the_papers_one_based_blocks() -> None:
    p = Placement(5, starts=(0, 2, 0), counts=(3, 3, 0))
    assert p.span(1) == (2, 5) and p.paper_first_block(1) == 3
    assert p.hosts(0, 2) and not p.hosts(0, 3) and not p.hosts(2, 0)
    assert p.coverage() == [1, 1, 2, 1, 1] and p.covers_all()
    assert not Placement(5, (0, 3), (2, 2)).covers_all()
    with pytest.raises(ValueError, match="outside"):
        Placement(4, (2,), (3,))


def test_first_server_holding_a_block_processes_it() -> None:
    p = Placement(5, starts=(0, 2), counts=(3, 3))
    route = route_from_chain(p, 0, [0, 1])
    assert route.hops == (Hop(0, 0, 3), Hop(1, 3, 5))
    assert chain_is_feasible(p, [0, 1])
    assert not chain_is_feasible(p, [1, 0])  # server 1 lacks block 0
    assert not chain_is_feasible(p, [0])  # stops at block 3
    with pytest.raises(ValueError, match=r"Lemma 3\.1"):
        route_from_chain(p, 0, [1])
    assert not route_is_valid(p, Route(0, (Hop(0, 0, 2), Hop(1, 2, 5))))  # server 0 would run to its end


def test_costs_follow_equations_1_4_and_8() -> None:
    spec = model(4, output_len=3, cache_bytes=4)
    inst = instance(
        spec, [100, 100], [0.01, 0.02], [[0.1, 0.2]], [1], prefill=[0.05, 0.08], input_rtts=[[0.3, 0.4]]
    )
    route = route_from_chain(Placement(4, (0, 1), (3, 3)), 0, [0, 1])  # 3 blocks on s0, 1 on s1
    assert route_token_time(inst, route) == pytest.approx(0.1 + 3 * 0.01 + 0.2 + 0.02)  # Eq. (4) summed
    assert route_first_token_time(inst, route) == pytest.approx(0.3 + 3 * 0.05 + 0.4 + 0.08)
    total = route_total_time(inst, route)  # Eq. (1): one prefill, then l_max - 1 decoding steps
    assert total == pytest.approx(0.93 + 2 * 0.35)
    eq8 = sum(hop_cost(inst, 0, h, "all_tokens") for h in route.hops)
    assert eq8 == pytest.approx(total / 3)


def test_memory_counts_blocks_and_one_cache_per_session_and_processed_block() -> None:
    inst = instance(model(4, block_bytes=10, cache_bytes=2), [40, 25], [0.01, 0.01], [[0.1, 0.1]], [2])
    p = Placement(4, (0, 2), (3, 2))
    route = route_from_chain(p, 0, [0, 1])  # s0 processes 3 blocks, s1 one
    routing = Routing((route, route))
    assert server_memory(inst, p, routing, 0) == 30 + 2 * 3 * 2
    assert server_memory(inst, p, routing, 1) == 20 + 2 * 1 * 2
    assert memory_violations(inst, p, routing) == [0]  # 42 > 40
    assert not solution_is_feasible(inst, p, routing)
    assert not solution_is_feasible(inst, p, Routing((route,)))  # one route for two requests


def test_network_from_latency_adds_transfer_both_ways() -> None:
    net = Network.from_latency(
        [[0.1]], n_clients=1, n_servers=1, bandwidth_bps=1e6, token_bytes=1000, input_len=20
    )
    assert net.token_rtt_s[0][0] == pytest.approx(0.1 + 2 * 8000 / 1e6)
    assert net.input_rtt_s[0][0] == pytest.approx(0.1 + 2 * 20 * 8000 / 1e6)
    with pytest.raises(ValueError, match="2x1"):
        Network.from_latency([[0.1]], n_clients=2, n_servers=1)


def test_model_cache_size_is_per_session_of_input_plus_output_tokens() -> None:
    spec = ModelSpec("m", 70, 10**9, cache_bytes_per_token=1000, input_len=20, output_len=128)
    assert spec.cache_bytes == 148_000
    with pytest.raises(ValueError):
        ModelSpec("m", 0, 1, 1)
