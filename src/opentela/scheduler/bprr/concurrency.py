"""How many concurrent sessions CG-BP should size the placement for (Section 3.3.1, the Remark after Cor. 3.6)."""

from __future__ import annotations

import math

from opentela.chain_routing import NoChainError, shortest_chain
from opentela.scheduler.bprr.cg_bprr import cg_bp, conservative_counts
from opentela.scheduler.bprr.problem import Instance, route_total_time
from opentela.scheduler.bprr.solution import chain_to_route, client_spans


def max_guaranteed_concurrency(instance: Instance) -> int:
    """Eq. (19): the largest |R| for which CG-BP's placement is sure to be feasible (may be 0)."""
    model, n_servers = instance.model, len(instance.servers)
    slack = sum(s.memory_bytes for s in instance.servers) - model.block_bytes * (model.n_blocks + n_servers)
    if model.cache_bytes == 0:
        return 1 << 30 if slack >= 0 else 0
    return max(slack // (model.cache_bytes * (model.n_blocks + n_servers)), 0)


def placement_feasible(instance: Instance, concurrency: int) -> bool:
    """Eq. (18): whether CG-BP sized for `concurrency` sessions places every block at least once."""
    return sum(conservative_counts(instance, concurrency)) >= instance.model.n_blocks


def expected_concurrency(rate_per_s: float, session_s: float) -> float:
    """Poisson arrivals during one session: mean plus one standard deviation, lambda D + sqrt(lambda D)."""
    arrivals = rate_per_s * session_s
    return arrivals + math.sqrt(arrivals)


def session_time(instance: Instance, concurrency: int) -> float:
    """The longest first session under CG-BP for `concurrency`: Eq. (1) on each client's shortest chain."""
    plan = cg_bp(instance, concurrency)
    if not plan.feasible:
        return math.inf

    worst = 0.0
    for client in range(len(instance.clients)):
        spans = client_spans(instance, plan.placement, client)
        try:
            chain = shortest_chain(spans, instance.model.n_blocks, output_len=instance.model.output_len)
        except NoChainError:
            return math.inf
        worst = max(worst, route_total_time(instance, chain_to_route(client, chain)))
    return worst


def choose_concurrency(
    instance: Instance, rate_per_s: float, session_s: float | None = None, *, max_rounds: int = 20
) -> int:
    """|R| = min(ceil(mean + std of arrivals during a session), Eq. 19 bound), at least 1.

    With no `session_s`, the session time is that of the placement sized for |R| itself: iterate from |R| = 1
    (fewer blocks per server make chains, and sessions, longer) until |R| stops growing.
    """
    cap = max(max_guaranteed_concurrency(instance), 1)
    if session_s is not None:
        return max(1, min(math.ceil(expected_concurrency(rate_per_s, session_s)), cap))
    r = 1
    for _ in range(max_rounds):
        duration = session_time(instance, r)
        if math.isinf(duration):
            return r
        nxt = max(1, min(math.ceil(expected_concurrency(rate_per_s, duration)), cap))
        if nxt <= r:
            return r
        r = nxt
    return r
