"""Online chain routers (opentela.chain_routing): shortest path, WS-RR, exact (21), PETALS' heuristic."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.chain_routing import (
    Link,
    NoChainError,
    SpanInfo,
    chain_time,
    chain_waiting_time,
    min_wait_chain,
    petals_chain,
    shortest_chain,
    waiting_time,
    ws_rr_chain,
)


def span(server: str, start: int, end: int, rtt: float, tau: float, **kw: object) -> SpanInfo:
    return SpanInfo(server, start, end, rtt, tau, **kw)  # type: ignore[arg-type]


def test_shortest_chain_minimises_equation_4_and_skips_excluded_servers() -> None:
    spans = [
        span("big", 0, 4, rtt=0.3, tau=0.1),  # 0.3 + 0.4 = 0.7
        span("a", 0, 2, rtt=0.2, tau=0.01),  # a + b: 0.22 + 0.22 = 0.44
        span("b", 1, 4, rtt=0.2, tau=0.01),
    ]
    chain = shortest_chain(spans, 4)
    assert chain == (Link("a", 0, 2), Link("b", 2, 4))  # b enters at block 2: a already ran block 1
    assert chain_time(spans, chain) == pytest.approx(0.44)
    assert shortest_chain(spans, 4, exclude={"b"}) == (Link("big", 0, 4),)
    with pytest.raises(NoChainError):
        shortest_chain(spans, 4, exclude={"big", "a"})


def test_sub_range_for_failover_clips_the_last_server() -> None:
    spans = [span("x", 0, 3, 0.1, 0.01), span("y", 1, 5, 0.1, 0.01), span("z", 2, 6, 0.05, 0.01)]
    # Replace a failed hop that ran blocks [1, 4): the chain must stop at 4, whatever its servers hold.
    chain = shortest_chain(spans, 6, lo=1, hi=4, exclude={"x"})
    assert chain[0].first_block == 1 and chain[-1].end_block == 4
    assert all(link.server != "x" for link in chain)


def test_waiting_time_is_equation_20() -> None:
    s = span("s", 0, 4, 0.1, 0.01, cache_slots=10, sessions=((5.0, 4), (2.0, 4)))
    assert s.free_slots == 2
    assert waiting_time(s, 2) == 0.0
    assert waiting_time(s, 5) == 2.0  # the 2-second session frees 4 slots: 6 >= 5
    assert waiting_time(s, 9) == 5.0
    assert waiting_time(s, 11) == math.inf  # more than the server can ever hold
    assert waiting_time(span("u", 0, 4, 0.1, 0.01), 100) == 0.0  # no cache limit known


def test_ws_rr_trades_waiting_against_a_slower_chain() -> None:
    def spans(wait: float) -> list[SpanInfo]:
        return [
            span("fast", 0, 4, 0.1, 0.01, cache_slots=4, sessions=((wait, 4),)),
            span("slow", 0, 4, 0.1, 0.05, cache_slots=8),
        ]

    # Session of 10 tokens: fast = 10 x 0.14 = 1.4 s, slow = 10 x 0.3 = 3 s; fast is worth waiting 1 s for.
    assert ws_rr_chain(spans(1.0), 4, output_len=10)[0].server == "fast"
    assert ws_rr_chain(spans(5.0), 4, output_len=10)[0].server == "slow"
    assert chain_waiting_time(spans(5.0), (Link("fast", 0, 4),)) == 5.0
    # Without the cache state the shortest path ignores the queue.
    assert shortest_chain(spans(5.0), 4)[0].server == "fast"


def test_exact_problem_21_waits_for_the_slowest_hop_not_the_sum() -> None:
    # Two-hop chain p1: each hop waits 10 s; one-hop chain p2 is 15 s slower over the session and never waits.
    spans = [
        span("a", 0, 2, 0.0, 1.0, cache_slots=2, sessions=((10.0, 2),)),
        span("b", 2, 4, 0.0, 1.0, cache_slots=2, sessions=((10.0, 2),)),
        span("c", 0, 4, 0.0, 1.0 + 15 / 4),
    ]
    # WS-RR relaxes max(10, 10) into 10 + 10 and prefers c (15 < 20); the exact solution takes a, b (10 < 15).
    assert [link.server for link in ws_rr_chain(spans, 4, output_len=1)] == ["c"]
    assert [link.server for link in min_wait_chain(spans, 4, output_len=1)] == ["a", "b"]


def test_petals_weights_differ_from_the_measured_model() -> None:
    spans = [
        span("all", 0, 4, rtt=0.3, tau=0.1),
        span("first", 0, 2, rtt=0.2, tau=0.01),
        span("second", 2, 4, rtt=0.2, tau=0.01),
    ]
    # The client forwards every hop, so first -> second costs 0.44 s per token against 0.7 s; PETALS prices the
    # hop by the servers' own pings between them (2 s: they are far apart) and picks the single server.
    assert [link.server for link in shortest_chain(spans, 4)] == ["first", "second"]
    assert [link.server for link in petals_chain(spans, 4, server_rtt=lambda a, b: 2.0)] == ["all"]
    assert [link.server for link in petals_chain(spans, 4)] == ["first", "second"]  # unknown ping: 0.15 s


def test_petals_penalises_a_server_without_cache_for_its_whole_span() -> None:
    spans = [
        span("full", 0, 4, 0.1, 0.01, cache_slots=3),  # 3 free slots < 4 blocks: +10 s
        span("other", 0, 4, 0.1, 0.5, cache_slots=8),
    ]
    assert petals_chain(spans, 4)[0].server == "other"
    assert petals_chain(spans, 4, check_cache=False)[0].server == "full"


def _brute_force(spans: list[SpanInfo], n: int) -> float:
    """The cheapest Eq. (4) chain by trying every server order (tiny cases)."""
    best = math.inf
    for k in range(1, len(spans) + 1):
        for order in itertools.permutations(spans, k):
            reach, cost = 0, 0.0
            for s in order:
                if not s.start <= reach < s.end:
                    break
                cost += s.hop_time(s.end - reach)
                reach = s.end
            else:
                if reach == n:
                    best = min(best, cost)
    return best


@st.composite
def span_sets(draw: st.DrawFn) -> tuple[list[SpanInfo], int]:
    n = draw(st.integers(1, 6))
    out = []
    for k in range(draw(st.integers(1, 5))):
        start = draw(st.integers(0, n - 1))
        end = draw(st.integers(start + 1, n))
        out.append(span(f"s{k}", start, end, draw(st.floats(0, 1)), draw(st.floats(0.001, 0.2))))
    return out, n


@settings(max_examples=150, deadline=None)
@given(span_sets())
def test_routers_return_contiguous_chains_and_shortest_is_optimal(case: tuple[list[SpanInfo], int]) -> None:
    spans, n = case
    best = _brute_force(spans, n)
    if math.isinf(best):
        with pytest.raises(NoChainError):
            shortest_chain(spans, n)
        return
    by_id = {s.server: s for s in spans}
    for chain in (shortest_chain(spans, n), ws_rr_chain(spans, n, output_len=5), petals_chain(spans, n)):
        assert chain[0].first_block == 0 and chain[-1].end_block == n
        for prev, nxt in itertools.pairwise(chain):
            assert prev.end_block == nxt.first_block
        for link in chain:
            s = by_id[link.server]
            assert s.start <= link.first_block < link.end_block == s.end
    assert chain_time(spans, shortest_chain(spans, n)) == pytest.approx(best)
