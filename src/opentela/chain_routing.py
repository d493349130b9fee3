"""Online chain routing for a model split across servers: pick the servers a session's blocks run on.

Pure functions shared by the planner's simulator and the gateway's chain client. A server holds the contiguous
blocks ``[start, end)``; a chain is an ordered list of ``Link(server, first_block, end_block)`` that processes
``[lo, hi)`` once each. As in PETALS and Sun et al. (Lemma 3.1), a session that reaches block ``b`` may enter any
server with ``start <= b < end`` and then runs it to the end of its span (clipped at ``hi``), so the routing graph
only needs the block boundaries as nodes.

Three routers:

- `shortest_chain`: Alg. 1 lines 10-13, least per-token time (Eq. 4, or Eq. 8 when `output_len` is given);
- `ws_rr_chain`: WS-RR, Eq. (20)-(21) relaxed to a shortest path with waiting-penalized link costs;
- `petals_chain`: PETALS' own min-latency Dijkstra over its heuristic edge weights.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

ServerId = Hashable


class NoChainError(LookupError):
    """No chain of the given servers covers the requested blocks."""


class Link(NamedTuple):
    """One hop of a chain: `server` processes blocks [first_block, end_block)."""

    server: ServerId
    first_block: int
    end_block: int


Chain = tuple[Link, ...]


@dataclass(frozen=True)
class SpanInfo:
    """What a client knows about one server: its blocks, its costs from this client and its cache state."""

    server: ServerId
    start: int
    end: int
    rtt_s: float
    """t_cj: per-token round trip from this client (network, serialization)."""
    block_time_s: float
    """tau_j: seconds per block per decoded token."""
    input_rtt_s: float | None = None
    """t^I_cj: round trip of a whole input; None: same as `rtt_s`."""
    prefill_block_s: float | None = None
    """tau^I_j: seconds per block for a whole input; None: same as `block_time_s`."""
    cache_slots: int | None = None
    """Attention caches (one block of one session each) the server can hold in all; None: unlimited."""
    sessions: tuple[tuple[float, int], ...] = ()
    """Active sessions as (remaining seconds, caches held), for the waiting time of Eq. (20)."""

    @property
    def free_slots(self) -> float:
        """Cache slots free now (infinite when unlimited)."""
        if self.cache_slots is None:
            return math.inf
        return self.cache_slots - sum(blocks for _, blocks in self.sessions)

    def hop_time(self, blocks: int, output_len: int | None = None) -> float:
        """Per-token time of processing `blocks` here: Eq. (4), or Eq. (8) averaged over `output_len` tokens."""
        decode = self.rtt_s + self.block_time_s * blocks
        if output_len is None:
            return decode
        first = (self.rtt_s if self.input_rtt_s is None else self.input_rtt_s) + blocks * (
            self.block_time_s if self.prefill_block_s is None else self.prefill_block_s
        )
        return (first + (output_len - 1) * decode) / output_len


def waiting_time(span: SpanInfo, blocks: int) -> float:
    """Eq. (20): how long until `span` has `blocks` free cache slots, as sessions finish soonest first."""
    if span.cache_slots is None:
        return 0.0
    if blocks > span.cache_slots:
        return math.inf
    ordered = sorted(span.sessions)
    held = sum(b for _, b in ordered)
    if span.cache_slots - held >= blocks:
        return 0.0
    for remaining, b in ordered:
        held -= b
        if span.cache_slots - held >= blocks:
            return max(remaining, 0.0)
    return math.inf  # unreachable: every session has ended by then


def _usable(spans: Iterable[SpanInfo], lo: int, hi: int, exclude: Iterable[ServerId]) -> list[SpanInfo]:
    banned = set(exclude)
    return [s for s in spans if s.server not in banned and s.start < hi and s.end > lo and s.start < s.end]


def _boundary_dijkstra(
    spans: Sequence[SpanInfo], lo: int, hi: int, cost: Callable[[SpanInfo, int, int], float]
) -> Chain:
    """Least-cost chain over block boundaries; `cost(span, first, end)` prices one hop (inf = unusable)."""
    best: dict[int, float] = {lo: 0.0}
    parent: dict[int, tuple[int, int]] = {}  # reach -> (previous reach, span index)
    heap: list[tuple[float, int, int]] = [(0.0, 0, lo)]  # (cost, hops, reach): fewer hops win ties
    while heap:
        dist, hops, reach = heapq.heappop(heap)
        if reach == hi:
            break
        if dist > best.get(reach, math.inf):
            continue
        for k, span in enumerate(spans):
            if not span.start <= reach < span.end:
                continue
            end = min(span.end, hi)
            step = cost(span, reach, end)
            if math.isinf(step):
                continue
            total = dist + step
            if total < best.get(end, math.inf):
                best[end] = total
                parent[end] = (reach, k)
                heapq.heappush(heap, (total, hops + 1, end))
    if hi not in parent and lo != hi:
        raise NoChainError(f"no chain of the available servers covers blocks [{lo}, {hi})")
    links: list[Link] = []
    reach = hi
    while reach != lo:
        prev, k = parent[reach]
        links.append(Link(spans[k].server, prev, reach))
        reach = prev
    return tuple(reversed(links))


def shortest_chain(
    spans: Iterable[SpanInfo],
    n_blocks: int,
    *,
    output_len: int | None = None,
    exclude: Iterable[ServerId] = (),
    lo: int = 0,
    hi: int | None = None,
) -> Chain:
    """Alg. 1 lines 11-12: the chain with the least per-token time over the feasible routing topology."""
    hi = n_blocks if hi is None else hi
    usable = _usable(spans, lo, hi, exclude)
    return _boundary_dijkstra(usable, lo, hi, lambda s, first, end: s.hop_time(end - first, output_len))


def ws_rr_chain(
    spans: Iterable[SpanInfo],
    n_blocks: int,
    *,
    output_len: int,
    exclude: Iterable[ServerId] = (),
    lo: int = 0,
    hi: int | None = None,
) -> Chain:
    """WS-RR (Alg. 2 lines 11-12): shortest path with link cost t^W_ij + l_max t^c_ij (Eq. 20-21)."""
    hi = n_blocks if hi is None else hi
    usable = _usable(spans, lo, hi, exclude)

    def cost(span: SpanInfo, first: int, end: int) -> float:
        # l_max x Eq. (8) is the hop's whole-session time, first token included (the refinement after Eq. 21).
        return waiting_time(span, end - first) + output_len * span.hop_time(end - first, output_len)

    return _boundary_dijkstra(usable, lo, hi, cost)


def min_wait_chain(
    spans: Iterable[SpanInfo],
    n_blocks: int,
    *,
    output_len: int,
    exclude: Iterable[ServerId] = (),
    lo: int = 0,
    hi: int | None = None,
) -> Chain:
    """Problem (21) solved exactly: min over waits W of W + l_max x the shortest chain using hops that wait <= W.

    The optimum waits for one of the hops' own waiting times, so trying each distinct one is enough; WS-RR is the
    relaxation of this that sums the waits instead.
    """
    hi = n_blocks if hi is None else hi
    usable = _usable(spans, lo, hi, exclude)
    waits = sorted(
        {waiting_time(s, min(s.end, hi) - b) for s in usable for b in range(max(s.start, lo), s.end)}
    )
    best: tuple[float, Chain] | None = None
    for limit in (w for w in waits if not math.isinf(w)):

        def cost(span: SpanInfo, first: int, end: int, limit: float = limit) -> float:
            if waiting_time(span, end - first) > limit:
                return math.inf
            return output_len * span.hop_time(end - first, output_len)

        try:
            chain = _boundary_dijkstra(usable, lo, hi, cost)
        except NoChainError:
            continue
        total = limit + chain_time(usable, chain, output_len) * output_len
        if best is None or total < best[0] - 1e-12:
            best = (total, chain)
    if best is None:
        raise NoChainError(f"no chain of the available servers covers blocks [{lo}, {hi})")
    return best[1]


def chain_waiting_time(spans: Iterable[SpanInfo], chain: Chain) -> float:
    """When every server on `chain` has room for it: the largest hop waiting time (Eq. 21b)."""
    by_id = {s.server: s for s in spans}
    return max(
        (waiting_time(by_id[link.server], link.end_block - link.first_block) for link in chain), default=0.0
    )


def chain_time(spans: Iterable[SpanInfo], chain: Chain, output_len: int | None = None) -> float:
    """Per-token time of `chain`: the sum of its hop times (Eq. 4, or Eq. 8 with `output_len`)."""
    by_id = {s.server: s for s in spans}
    return sum(by_id[link.server].hop_time(link.end_block - link.first_block, output_len) for link in chain)


# PETALS' constants (client/routing/sequence_manager.py, petals 2.2): serialization overhead per hop, the penalty
# for a server without enough free cache, the delay assumed for an unknown ping and the cap on any one delay.
PETALS_OVERHEAD_S = 0.018
PETALS_ALLOC_PENALTY_S = 10.0
PETALS_DEFAULT_DELAY_S = 0.15
PETALS_MAX_DELAY_S = 5.0


def _petals_delay(rtt: float | None) -> float:
    """PETALS turns a ping into a one-way delay, with a default when unknown and a cap when unreachable."""
    if rtt is None:
        return PETALS_DEFAULT_DELAY_S
    return min(rtt / 2, PETALS_MAX_DELAY_S)


def petals_chain(
    spans: Iterable[SpanInfo],
    n_blocks: int,
    *,
    server_rtt: Callable[[ServerId, ServerId], float | None] | None = None,
    check_cache: bool = True,
    exclude: Iterable[ServerId] = (),
    lo: int = 0,
    hi: int | None = None,
) -> Chain:
    """PETALS' min-latency routing: Dijkstra over one-way delays, 18 ms per hop, 1/rps per block, 10 s if full.

    Its weights differ from the measured model (Eq. 4): half the ping instead of a round trip, the next hop's
    delay is the previous *server's* ping to it (`server_rtt`; unknown pings count 0.15 s), and a server whose
    free cache cannot hold its whole span for this session is penalized rather than excluded.
    """
    hi = n_blocks if hi is None else hi
    if lo == hi:
        return ()
    usable = _usable(spans, lo, hi, exclude)
    ping = server_rtt or (lambda _a, _b: None)

    def enter(span: SpanInfo, reach: int, delay: float) -> float:
        penalty = PETALS_ALLOC_PENALTY_S if check_cache and span.free_slots < span.end - span.start else 0.0
        return delay + PETALS_OVERHEAD_S + penalty + span.block_time_s * (min(span.end, hi) - reach)

    start, goal = -1, len(usable)  # node k in between: the session has run span k to its (clipped) end
    best: dict[int, float] = {start: 0.0}
    parent: dict[int, int] = {}
    heap: list[tuple[float, int]] = [(0.0, start)]
    while heap:
        dist, node = heapq.heappop(heap)
        if node == goal:
            break
        if dist > best.get(node, math.inf):
            continue
        reach = lo if node == start else min(usable[node].end, hi)
        moves: list[tuple[int, float]] = []
        if node != start and reach == hi:
            moves.append((goal, _petals_delay(usable[node].rtt_s)))
        for k, span in enumerate(usable):
            if k != node and span.start <= reach < span.end:
                rtt = span.rtt_s if node == start else ping(usable[node].server, span.server)
                moves.append((k, enter(span, reach, _petals_delay(rtt))))
        for nxt, step in moves:
            if dist + step < best.get(nxt, math.inf):
                best[nxt] = dist + step
                parent[nxt] = node
                heapq.heappush(heap, (dist + step, nxt))
    if goal not in parent:
        raise NoChainError(f"no chain of the available servers covers blocks [{lo}, {hi})")
    order: list[int] = []
    node = parent[goal]
    while node != start:
        order.append(node)
        node = parent[node]
    links: list[Link] = []
    reach = lo
    for k in reversed(order):
        end = min(usable[k].end, hi)
        links.append(Link(usable[k].server, reach, end))
        reach = end
    return tuple(links)
