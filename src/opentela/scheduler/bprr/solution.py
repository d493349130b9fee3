"""What a BPRR planner returns, and the glue between instances and the online chain routers."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from opentela.chain_routing import Chain, SpanInfo, petals_chain, shortest_chain
from opentela.scheduler.bprr.problem import (
    Hop,
    Instance,
    Objective,
    Placement,
    Route,
    Routing,
    mean_token_time,
)

Status = Literal["optimal", "feasible", "infeasible", "unknown"]
Router = Literal["shortest", "petals"]


@dataclass(frozen=True)
class Plan:
    """A placement, the attention caches each server reserves, and (offline) one route per request."""

    algorithm: str
    placement: Placement
    cache_slots: tuple[int, ...]
    """Caches (one block of one session each) server j can hold next to its blocks."""
    routing: Routing | None = None
    status: Status = "feasible"
    mean_token_time_s: float | None = None
    """Average per-token time of `routing` under the plan's objective (Eq. 4 or Eq. 8)."""
    concurrency: int = 0
    """|R|: the concurrent requests the placement was sized for."""
    bound_s: float | None = None
    """Theorem 3.5's guarantee on the per-token time (CG-BP/CG-BPRR only)."""
    solve_s: float = 0.0
    """Wall time the algorithm took."""

    @property
    def feasible(self) -> bool:
        """Whether every block is placed (and, offline, every request routed)."""
        return self.status in ("optimal", "feasible")


def free_cache_slots(instance: Instance, placement: Placement, server: int) -> int:
    """floor((M_j - s_m m_j) / s_c): caches server j fits next to its blocks (the capacity in Eq. 20)."""
    spare = instance.servers[server].memory_bytes - instance.model.block_bytes * placement.counts[server]
    if spare < 0:
        return 0
    cache = instance.model.cache_bytes
    return spare // cache if cache else 1 << 62


def client_spans(
    instance: Instance,
    placement: Placement,
    client: int,
    *,
    cache_slots: Sequence[int] | None = None,
    sessions: Mapping[int, Sequence[tuple[float, int]]] | None = None,
) -> list[SpanInfo]:
    """The servers as client `client` sees them (server id = index), for `opentela.chain_routing`."""
    net = instance.network
    spans = []
    for j, server in enumerate(instance.servers):
        if placement.counts[j] == 0:
            continue
        start, end = placement.span(j)
        spans.append(
            SpanInfo(
                server=j,
                start=start,
                end=end,
                rtt_s=net.token_rtt_s[client][j],
                block_time_s=server.tau_decode_s,
                input_rtt_s=net.input_rtt_s[client][j],
                prefill_block_s=server.tau_prefill_s,
                cache_slots=None if cache_slots is None else cache_slots[j],
                sessions=tuple((sessions or {}).get(j, ())),
            )
        )
    return spans


def chain_to_route(client: int, chain: Chain) -> Route:
    """A router's chain (server ids are instance indices) as a `Route`."""
    hops = []
    for link in chain:
        if not isinstance(link.server, int):
            raise TypeError(f"chain names server {link.server!r}; expected an instance index")
        hops.append(Hop(link.server, link.first_block, link.end_block))
    return Route(client, tuple(hops))


def route_plan(
    instance: Instance, plan: Plan, router: Router = "shortest", objective: Objective = "decode"
) -> Plan:
    """Give a placement-only plan one chain per client (every request of a client on it), idle servers assumed."""
    if not plan.placement.covers_all():
        return plan
    output_len = None if objective == "decode" else instance.model.output_len
    routes: list[Route] = []
    for client, count in enumerate(instance.requests_per_client):
        spans = client_spans(instance, plan.placement, client, cache_slots=plan.cache_slots)
        if router == "petals":
            chain = petals_chain(spans, instance.model.n_blocks, server_rtt=_server_pings(instance))
        else:
            chain = shortest_chain(spans, instance.model.n_blocks, output_len=output_len)
        routes.extend([chain_to_route(client, chain)] * count)
    routing = Routing(tuple(routes))
    return replace(plan, routing=routing, mean_token_time_s=mean_token_time(instance, routing, objective))


def _server_pings(instance: Instance) -> Callable[[Hashable, Hashable], float | None]:
    """Server-to-server pings for PETALS' router (twice the one-way delays), unknown when the network lacks them."""
    delays = instance.network.server_delay_s

    def ping(a: Hashable, b: Hashable) -> float | None:
        if delays is None or not isinstance(a, int) or not isinstance(b, int):
            return None
        return 2 * delays[a][b]

    return ping
