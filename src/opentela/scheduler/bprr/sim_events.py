"""Requests, per-request records and the cache-slot ledger of the pipeline-parallel inference simulator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentela.scheduler.bprr.problem import Route


@dataclass(frozen=True)
class SimRequest:
    """One inference session: who sends it, when, and how many tokens it generates."""

    id: int
    client: int
    arrival_s: float
    output_len: int


@dataclass
class RequestRecord:
    """What happened to one request; times are absolute simulation seconds (NaN until they happen)."""

    request: SimRequest
    route: Route | None = None
    start_s: float = math.nan
    """Admission: every server on the chain has allocated the session's caches."""
    first_token_s: float = math.nan
    finish_s: float = math.nan
    retries: int = 0
    rejected: bool = False
    """No route, or a hop needing more caches than its server has in all: the request is never served."""

    @property
    def served(self) -> bool:
        """Whether the session ran to its last token."""
        return not self.rejected and not math.isnan(self.finish_s)

    @property
    def waiting_s(self) -> float:
        """Arrival to admission."""
        return self.start_s - self.request.arrival_s

    @property
    def first_token_time_s(self) -> float:
        """Arrival to the first token: waiting, session setup and prefill along the chain."""
        return self.first_token_s - self.request.arrival_s

    @property
    def remaining_token_s(self) -> float:
        """Mean time of each token after the first (Eq. 4 summed over the chain)."""
        n = self.request.output_len
        return (self.finish_s - self.first_token_s) / (n - 1) if n > 1 else 0.0

    @property
    def total_s(self) -> float:
        """Arrival to the last token."""
        return self.finish_s - self.request.arrival_s

    @property
    def per_token_s(self) -> float:
        """The session's time divided over all its tokens (the paper's per-token metric for one request)."""
        return self.total_s / self.request.output_len


@dataclass
class CacheLedger:
    """Attention-cache slots per server (one slot = one block of one session): capacity, use and sessions.

    Admitted sessions hold `Hop.n_blocks` slots on each hop's server until they finish. Sessions routed but still
    waiting are kept as reservations with an estimated finish, so the routers' view of Eq. (20) sees the queue
    the way the paper's state (T_r^j, M_r^j) does: every submitted, unfinished request.
    """

    capacity: tuple[int, ...]
    used: list[int] = field(init=False)
    active: dict[int, tuple[float, Route]] = field(default_factory=dict)
    pending: dict[int, tuple[float, Route]] = field(default_factory=dict)
    by_server: list[dict[int, tuple[float, int]]] = field(init=False)
    """Per server: request id -> (finish or estimated finish, slots), active and pending alike."""

    def __post_init__(self) -> None:
        self.used = [0] * len(self.capacity)
        self.by_server = [{} for _ in self.capacity]

    def fits(self, route: Route) -> bool:
        """Whether every hop's server has the free slots this route needs now."""
        return all(self.used[h.server] + h.n_blocks <= self.capacity[h.server] for h in route.hops)

    def can_ever_fit(self, route: Route) -> bool:
        """Whether the route fits on idle servers (otherwise waiting cannot help)."""
        return all(h.n_blocks <= self.capacity[h.server] for h in route.hops)

    def _book(self, request_id: int, route: Route, finish_s: float) -> None:
        for h in route.hops:
            self.by_server[h.server][request_id] = (finish_s, h.n_blocks)

    def admit(self, request_id: int, route: Route, finish_s: float) -> None:
        """Allocate the route's caches until `finish_s`."""
        if not self.fits(route):
            raise RuntimeError(f"request {request_id} admitted without room for its caches")
        self.pending.pop(request_id, None)
        for h in route.hops:
            self.used[h.server] += h.n_blocks
        self.active[request_id] = (finish_s, route)
        self._book(request_id, route, finish_s)

    def release(self, request_id: int) -> None:
        """Free a finished session's caches."""
        _, route = self.active.pop(request_id)
        for h in route.hops:
            self.used[h.server] -= h.n_blocks
            del self.by_server[h.server][request_id]

    def reserve(self, request_id: int, route: Route, estimated_finish_s: float) -> None:
        """Record a routed, waiting session for the routers' view."""
        self.pending[request_id] = (estimated_finish_s, route)
        self._book(request_id, route, estimated_finish_s)

    def sessions(self, server: int, now: float) -> tuple[tuple[float, int], ...]:
        """(remaining seconds, slots) of every submitted, unfinished session on `server`."""
        return tuple((max(finish - now, 0.0), blocks) for finish, blocks in self.by_server[server].values())


@dataclass(frozen=True)
class CacheView:
    """What a router may read at a request's arrival: the time, every server's capacity and its sessions."""

    now: float
    ledger: CacheLedger

    @property
    def capacity(self) -> Sequence[int]:
        """Cache slots per server."""
        return self.ledger.capacity

    def sessions(self, server: int) -> tuple[tuple[float, int], ...]:
        """(remaining seconds, slots) per session on `server`, waiting ones included."""
        return self.ledger.sessions(server, self.now)
