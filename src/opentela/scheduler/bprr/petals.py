"""PETALS' block placement, the baseline of Sun et al., and the ablations of their Section 4.3.

What PETALS 2.x does (server/server.py, server/block_selection.py, server/throughput.py), restated:

- a server fills its memory: ``num_blocks = floor((M - reserve) / (s_m + cache per block))`` where the cache per
  block is a fixed ``attn_cache_tokens`` (4096 for models without multi-query attention) whatever the load, and
  that fixed pool is all the attention cache it will ever hand out, the allocation the paper blames;
- it reports a throughput ``min(forward_rps / ((num_blocks + 1) / 2), network_rps)`` (tokens/s; a request is
  assumed to use half its blocks on average);
- servers join one after another; each sums the throughput of the servers already holding every block and
  takes the window of ``num_blocks`` blocks whose sorted throughputs are lexicographically smallest, first on ties.

Periodic rebalancing (``should_choose_other_blocks``) is not modelled: the paper's baseline places servers once, in
their join order. Routing for these placements is `opentela.chain_routing.petals_chain` (PETALS) or
`opentela.chain_routing.min_wait_chain` (the 'Optimized RR' ablation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from opentela.scheduler.bprr.cg_bprr import amortized_times, conservative_counts
from opentela.scheduler.bprr.problem import Instance, Placement, ServerSpec
from opentela.scheduler.bprr.solution import Plan, free_cache_slots

PETALS_CACHE_TOKENS = 4096
"""PETALS' default ``attn_cache_tokens`` per hosted block (16384 for multi-query attention models)."""


def petals_block_count(
    instance: Instance, server: ServerSpec, *, cache_tokens: int = PETALS_CACHE_TOKENS, reserve_bytes: int = 0
) -> int:
    """Blocks PETALS puts on `server`: as many as fit with a fixed cache of `cache_tokens` tokens each."""
    model = instance.model
    per_block = model.block_bytes + cache_tokens * model.cache_bytes_per_token
    return int(min(max(server.memory_bytes - reserve_bytes, 0) // per_block, model.n_blocks))


def petals_cache_slots(instance: Instance, count: int, cache_tokens: int = PETALS_CACHE_TOKENS) -> int:
    """Caches (block x session of l^I + l tokens) that PETALS' fixed pool of `count` x `cache_tokens` holds."""
    return count * cache_tokens // (instance.model.input_len + instance.model.output_len)


def petals_throughput(
    instance: Instance, server: ServerSpec, count: int, network_rps: float = math.inf
) -> float:
    """PETALS' reported throughput: batch-forward tokens/s per block over (count + 1) / 2, capped by the network."""
    if server.tau_prefill_s > 0:
        forward_rps = instance.model.input_len / server.tau_prefill_s
    elif server.tau_decode_s > 0:
        forward_rps = 1 / server.tau_decode_s
    else:
        forward_rps = math.inf
    return min(forward_rps / ((count + 1) / 2), network_rps)


def choose_start(throughputs: Sequence[float], count: int) -> int:
    """PETALS' block choice: the window whose sorted throughputs are lexicographically smallest, first on ties."""
    return min(range(len(throughputs) - count + 1), key=lambda a: (sorted(throughputs[a : a + count]), a))


def petals_placement(
    instance: Instance,
    *,
    order: Sequence[int] | None = None,
    counts: Sequence[int] | None = None,
    cache_slots: Sequence[int] | None = None,
    cache_tokens: int = PETALS_CACHE_TOKENS,
    reserve_bytes: int = 0,
    network_rps: Sequence[float] | None = None,
    algorithm: str = "petals",
) -> Plan:
    """Servers join in `order` (default: instance order) and each takes PETALS' choice of blocks.

    `counts` and `cache_slots` override PETALS' own memory split (for the 'Optimized Number' ablation).
    """
    began = time.perf_counter()
    n = instance.model.n_blocks
    n_servers = len(instance.servers)
    order = list(range(n_servers)) if order is None else list(order)
    if sorted(order) != list(range(n_servers)):
        raise ValueError("order must list every server index once")
    if counts is None:
        counts = [
            petals_block_count(instance, s, cache_tokens=cache_tokens, reserve_bytes=reserve_bytes)
            for s in instance.servers
        ]
    if cache_slots is None:
        cache_slots = [petals_cache_slots(instance, c, cache_tokens) for c in counts]
    throughputs = [0.0] * n
    starts = [0] * n_servers
    for j in order:
        if counts[j] == 0:
            continue  # PETALS refuses to start a server that cannot hold one block
        starts[j] = choose_start(throughputs, counts[j])
        rps = petals_throughput(
            instance, instance.servers[j], counts[j], network_rps[j] if network_rps else math.inf
        )
        for b in range(starts[j], starts[j] + counts[j]):
            throughputs[b] += rps
    placement = Placement(n, tuple(starts), tuple(counts))
    return Plan(
        algorithm=algorithm,
        placement=placement,
        cache_slots=tuple(cache_slots),
        status="feasible" if placement.covers_all() else "infeasible",
        concurrency=instance.n_requests,
        solve_s=time.perf_counter() - began,
    )


def optimized_order(
    instance: Instance, concurrency: int, *, cache_tokens: int = PETALS_CACHE_TOKENS, reserve_bytes: int = 0
) -> Plan:
    """Ablation 'Optimized Order': PETALS' placement, servers joining in CG-BP's order (Alg. 2 line 3)."""
    amortized = amortized_times(instance, conservative_counts(instance, max(concurrency, 1)))
    order = sorted(range(len(instance.servers)), key=lambda j: (amortized[j], j))
    return petals_placement(
        instance,
        order=order,
        cache_tokens=cache_tokens,
        reserve_bytes=reserve_bytes,
        algorithm="petals-optimized-order",
    )


def optimized_number(instance: Instance, concurrency: int, order: Sequence[int] | None = None) -> Plan:
    """Ablation 'Optimized Number': PETALS' block choice with CG-BP's block counts; the rest of memory caches."""
    counts = conservative_counts(instance, max(concurrency, 1))
    plan = petals_placement(instance, order=order, counts=counts, cache_slots=[0] * len(counts))
    slots = tuple(free_cache_slots(instance, plan.placement, j) for j in range(len(counts)))
    return Plan(
        algorithm="petals-optimized-number",
        placement=plan.placement,
        cache_slots=slots,
        status=plan.status,
        concurrency=max(concurrency, 1),
        solve_s=plan.solve_s,
    )
