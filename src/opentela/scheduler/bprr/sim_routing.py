"""Routers for the simulator: the planner's fixed routes, and the online routers of `opentela.chain_routing`.

Each router sees the servers as one client does (`SpanInfo`: span, RTTs, per-block times, cache slots and the
submitted sessions with their remaining times) and returns a `Route`, or None when no chain covers the model.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from opentela.chain_routing import (
    Chain,
    NoChainError,
    SpanInfo,
    min_wait_chain,
    petals_chain,
    shortest_chain,
    ws_rr_chain,
)
from opentela.scheduler.bprr.problem import Instance, Objective, Placement, Route
from opentela.scheduler.bprr.sim_events import CacheView, SimRequest
from opentela.scheduler.bprr.solution import chain_to_route, client_spans

ChainFinder = Callable[[list[SpanInfo], SimRequest], Chain]


@dataclass(frozen=True)
class FixedRouter:
    """Offline routing: every request of a client takes that client's planned route."""

    routes: Mapping[int, Route]

    def __call__(self, request: SimRequest, view: CacheView) -> Route | None:
        """The planned route of the request's client (None if it has none)."""
        return self.routes.get(request.client)


@dataclass(frozen=True)
class SpanRouter:
    """A router over the client's view of the servers, state included; `finder` picks the chain."""

    instance: Instance
    placement: Placement
    cache_slots: Sequence[int]
    finder: ChainFinder
    name: str = "spans"

    def spans(self, request: SimRequest, view: CacheView) -> list[SpanInfo]:
        """The servers as the request's client sees them now."""
        sessions = {
            j: view.sessions(j) for j in range(len(self.instance.servers)) if self.placement.counts[j]
        }
        return client_spans(
            self.instance, self.placement, request.client, cache_slots=self.cache_slots, sessions=sessions
        )

    def __call__(self, request: SimRequest, view: CacheView) -> Route | None:
        """The finder's chain as a Route, or None when the placement leaves a block uncovered."""
        try:
            chain = self.finder(self.spans(request, view), request)
        except NoChainError:
            return None
        return chain_to_route(request.client, chain)


def shortest_router(
    instance: Instance, placement: Placement, cache_slots: Sequence[int], objective: Objective = "decode"
) -> SpanRouter:
    """Alg. 1 lines 10-13 online: the least per-token chain, blind to the servers' load."""
    n = instance.model.n_blocks

    def find(spans: list[SpanInfo], request: SimRequest) -> Chain:
        return shortest_chain(spans, n, output_len=None if objective == "decode" else request.output_len)

    return SpanRouter(instance, placement, cache_slots, find, "shortest")


def ws_rr_router(instance: Instance, placement: Placement, cache_slots: Sequence[int]) -> SpanRouter:
    """WS-RR (Alg. 2 lines 10-13): shortest path with waiting-penalized link costs."""
    n = instance.model.n_blocks
    return SpanRouter(
        instance, placement, cache_slots, lambda s, r: ws_rr_chain(s, n, output_len=r.output_len), "ws-rr"
    )


def min_wait_router(instance: Instance, placement: Placement, cache_slots: Sequence[int]) -> SpanRouter:
    """'Optimized RR': the individually optimal scheduling problem (21) solved exactly."""
    n = instance.model.n_blocks
    return SpanRouter(
        instance,
        placement,
        cache_slots,
        lambda s, r: min_wait_chain(s, n, output_len=r.output_len),
        "min-wait",
    )


@dataclass(frozen=True)
class PetalsRouter(SpanRouter):
    """PETALS' client: Dijkstra over half-pings, 18 ms per hop, tau per block and 10 s past a full server."""

    client_ping_s: Sequence[Sequence[float]] = ()
    """Raw RTT [client][server] PETALS measures with ping (not the per-token RTT of Eq. 4)."""
    server_ping_s: Sequence[Sequence[float]] = ()
    name: str = field(default="petals")

    def spans(self, request: SimRequest, view: CacheView) -> list[SpanInfo]:
        """The client's spans with the raw ping in place of the per-token RTT, as PETALS' weights use."""
        ping = self.client_ping_s[request.client]
        return [
            SpanInfo(
                s.server,
                s.start,
                s.end,
                ping[s.server],
                s.block_time_s,
                cache_slots=s.cache_slots,
                sessions=s.sessions,
            )
            for s in super().spans(request, view)
            if isinstance(s.server, int)
        ]


def petals_router(
    instance: Instance,
    placement: Placement,
    cache_slots: Sequence[int],
    client_ping_s: Sequence[Sequence[float]],
    server_ping_s: Sequence[Sequence[float]],
) -> PetalsRouter:
    """PETALS' own routing over `placement`, with the servers' pings to one another."""
    n = instance.model.n_blocks

    def ping(a: Hashable, b: Hashable) -> float | None:
        return server_ping_s[a][b] if isinstance(a, int) and isinstance(b, int) else None

    def find(spans: list[SpanInfo], request: SimRequest) -> Chain:
        return petals_chain(spans, n, server_rtt=ping)

    return PetalsRouter(instance, placement, cache_slots, find, "petals", client_ping_s, server_ping_s)
