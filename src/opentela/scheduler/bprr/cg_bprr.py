"""CG-BPRR (Alg. 1) and its online half CG-BP (Alg. 2 lines 1-9): conservative greedy block placement.

Step 1 sizes every server for the worst case, all |R| requests through all its blocks; step 2 places blocks on the
servers in increasing order of amortized time (Eq. 14) where they serve the most unserved time; step 3 routes
each client on its shortest chain (Lemma 3.4: optimal under this placement).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from opentela.chain_routing import NoChainError, shortest_chain
from opentela.scheduler.bprr.problem import Instance, Objective, Placement, Route, Routing, mean_token_time
from opentela.scheduler.bprr.solution import Plan, chain_to_route, client_spans, free_cache_slots


def conservative_counts(instance: Instance, concurrency: int) -> tuple[int, ...]:
    """Alg. 1 line 1: m_j = min(floor(M_j / (s_m + s_c |R|)), L)."""
    model = instance.model
    per_block = model.block_bytes + model.cache_bytes * concurrency
    return tuple(min(s.memory_bytes // per_block, model.n_blocks) for s in instance.servers)


def amortized_times(instance: Instance, counts: Sequence[int]) -> tuple[float, ...]:
    """Eq. (14): tau_j + t_{*j} / m_j, the worst client's time per hosted block (inf for an unused server)."""
    net = instance.network
    return tuple(
        s.tau_decode_s + net.worst_token_rtt(j) / m if m else math.inf
        for j, (s, m) in enumerate(zip(instance.servers, counts, strict=True))
    )


def session_capacity(instance: Instance, counts: Sequence[int]) -> tuple[int, ...]:
    """Eq. (15): floor((M_j - s_m m_j) / (s_c m_j)), sessions server j serves through all its blocks at once."""
    model = instance.model
    out = []
    for s, m in zip(instance.servers, counts, strict=True):
        if m == 0:
            out.append(0)
        elif model.cache_bytes == 0:
            out.append(1 << 62)
        else:
            out.append(max(s.memory_bytes - model.block_bytes * m, 0) // (model.cache_bytes * m))
    return tuple(out)


def greedy_starts(instance: Instance, counts: Sequence[int], concurrency: int) -> tuple[int, ...]:
    """Alg. 1 lines 2-9: first block of each server, placing fastest servers where time is worst served."""
    n = instance.model.n_blocks
    amortized = amortized_times(instance, counts)
    capacity = session_capacity(instance, counts)
    used = [j for j in range(len(counts)) if counts[j] > 0]
    # The dummy server 0 holds every block at first; it only has to be slower than every real server.
    dummy = 2 * max((amortized[j] for j in used), default=1.0) + 1
    cover = [0] * n  # C_b
    spent = [dummy * concurrency] * n  # T_b
    starts = [0] * len(counts)
    for j in sorted(used, key=lambda k: (amortized[k], k)):
        m = counts[j]
        windows = range(n - m + 1)
        if any(c < concurrency for c in cover):
            # Line 5: the window with the most unserved time that still holds an unserved block, first on ties.
            best, best_sum = -1, -math.inf
            for a in windows:
                if any(c < concurrency for c in cover[a : a + m]):
                    total = math.fsum(spent[a : a + m])
                    if total > best_sum:
                        best, best_sum = a, total
            a_j = best
        else:
            # Line 7: every block is served; add capacity where it is thinnest (lexicographic sorted window).
            a_j = min(windows, key=lambda a: (sorted(cover[a : a + m]), a))
        starts[j] = a_j
        for b in range(a_j, a_j + m):
            spent[b] -= (dummy - amortized[j]) * min(max(concurrency - cover[b], 0), capacity[j])  # line 8
            cover[b] += capacity[j]  # line 9
    return tuple(starts)


def theorem_bound(instance: Instance, counts: Sequence[int]) -> float | None:
    """Eq. (17): Theorem 3.5's per-token guarantee, or None when the counts cannot cover the model."""
    amortized = amortized_times(instance, counts)
    order = sorted((j for j in range(len(counts)) if counts[j]), key=lambda k: (amortized[k], k))
    total, bound = 0, 0.0
    for j in order:
        total += counts[j]
        bound += amortized[j] * counts[j]
        if total >= instance.model.n_blocks:
            return bound - instance.servers[j].tau_decode_s * (total - instance.model.n_blocks)
    return None


def lower_bound(instance: Instance) -> float:
    """Lemma B.1: no solution's average per-token time is below this (inf when no server fits a block)."""
    model, net = instance.model, instance.network
    most = [
        min(s.memory_bytes // (model.block_bytes + model.cache_bytes), model.n_blocks)
        for s in instance.servers
    ]
    total = 0.0
    for client, count in enumerate(instance.requests_per_client):
        if count == 0:
            continue
        # Relaxed routing block by block at tau_j + t_cj / m_bar_j per block, fastest servers first.
        rates = sorted(
            (s.tau_decode_s + net.token_rtt_s[client][j] / most[j], most[j])
            for j, s in enumerate(instance.servers)
            if most[j] > 0
        )
        left, best = model.n_blocks, 0.0
        for rate, blocks in rates:
            used = min(blocks, left)
            best += rate * used
            left -= used
            if left == 0:
                break
        total += count * (best if left == 0 else math.inf)
    return total / max(instance.n_requests, 1)


def cg_bp(instance: Instance, concurrency: int | None = None) -> Plan:
    """CG-BP: the placement of Alg. 2 lines 1-9, sized for `concurrency` (default |R|) concurrent sessions."""
    began = time.perf_counter()
    r = max(
        instance.n_requests if concurrency is None else concurrency, 1
    )  # |R| = 0 would place nothing useful
    counts = conservative_counts(instance, r)
    placement = Placement(instance.model.n_blocks, greedy_starts(instance, counts, r), counts)
    slots = tuple(free_cache_slots(instance, placement, j) for j in range(len(counts)))
    return Plan(
        algorithm="cg-bp",
        placement=placement,
        cache_slots=slots,
        status="feasible" if placement.covers_all() else "infeasible",
        concurrency=r,
        bound_s=theorem_bound(instance, counts),
        solve_s=time.perf_counter() - began,
    )


def shortest_path_routing(
    instance: Instance, placement: Placement, objective: Objective = "decode"
) -> Routing:
    """Alg. 1 lines 10-13: every request of a client takes that client's least-cost chain."""
    output_len = None if objective == "decode" else instance.model.output_len
    routes: list[Route] = []
    for client, count in enumerate(instance.requests_per_client):
        if count == 0:
            continue
        chain = shortest_chain(
            client_spans(instance, placement, client), instance.model.n_blocks, output_len=output_len
        )
        routes.extend([chain_to_route(client, chain)] * count)
    return Routing(tuple(routes))


def cg_bprr(instance: Instance, objective: Objective = "decode") -> Plan:
    """CG-BPRR (Alg. 1) for the offline instance: CG-BP for |R| requests, then shortest-path routing."""
    began = time.perf_counter()
    plan = cg_bp(instance)
    if not plan.feasible:
        return replace(plan, algorithm="cg-bprr", solve_s=time.perf_counter() - began)
    try:
        routing = shortest_path_routing(instance, plan.placement, objective)
    except NoChainError:  # cannot happen when every block is placed; kept so a bug reads as infeasible
        return replace(plan, algorithm="cg-bprr", status="infeasible")
    return Plan(
        algorithm="cg-bprr",
        placement=plan.placement,
        cache_slots=plan.cache_slots,
        routing=routing,
        status="feasible",
        mean_token_time_s=mean_token_time(instance, routing, objective),
        concurrency=plan.concurrency,
        bound_s=plan.bound_s,
        solve_s=time.perf_counter() - began,
    )
