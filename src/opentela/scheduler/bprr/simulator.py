"""Discrete-event simulation of pipeline-parallel inference over a block placement (Sun et al.'s simulator, redone).

Requests arrive (Poisson or a trace) and are routed at arrival by a router that may read the servers' cache state.
A session starts only when every server on its chain has free attention-cache slots for the blocks it processes
there (Eq. 5); until then it waits, in strict FIFO order or, as PETALS' client does, retrying with binary
exponential backoff (1 s, 2 s, ... capped at 60 s). Once started, its times are closed-form: a setup constant,
the first token after sum_j (t^I_cj + k_j tau^I_j) and every further token after sum_j (t_cj + k_j tau_j)
(Eqs. 1 and 4). Concurrency does not slow a session down while its caches fit, the paper's measured finding
(Fig. 2), so events are needed only at arrivals, retries and session ends. Deterministic: no wall clock, no
global random state; ties at one instant resolve finishes first, then in request order.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from opentela.chain_routing import SpanInfo, waiting_time
from opentela.scheduler.bprr.problem import Instance, Route, route_first_token_time, route_token_time
from opentela.scheduler.bprr.sim_events import CacheLedger, CacheView, RequestRecord, SimRequest

Admission = Literal["fifo", "backoff"]


class Router(Protocol):
    """Chooses a request's chain at its arrival; None when no chain covers the model."""

    def __call__(self, request: SimRequest, view: CacheView) -> Route | None:
        """The route for `request` given the servers' state in `view`."""
        ...


@dataclass(frozen=True)
class SimConfig:
    """How sessions are admitted and what they cost beyond Eq. (1)."""

    admission: Admission = "fifo"
    """'fifo': a strict queue, head first, started the moment its chain has room; 'backoff': PETALS' retries."""
    setup_s: float = 0.0
    """Seconds from admission to the start of prefill (session start and cache allocation), caches held."""
    backoff_first_s: float = 1.0
    backoff_cap_s: float = 60.0
    trace: bool = False
    """Record the slots in use on every server after every event (for checking Eq. 5)."""


@dataclass
class SimResult:
    """Per-request records and the aggregates the paper reports."""

    records: list[RequestRecord]
    peak_used: tuple[int, ...]
    max_in_system: int
    trace: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)

    @property
    def served(self) -> list[RequestRecord]:
        """Requests that ran to completion."""
        return [r for r in self.records if r.served]

    @property
    def rejected(self) -> int:
        """Requests no chain could ever serve."""
        return sum(r.rejected for r in self.records)

    def mean_token_time_s(self) -> float:
        """Average per-token time over all tokens: total session times over total tokens generated."""
        done = self.served
        tokens = sum(r.request.output_len for r in done)
        return math.fsum(r.total_s for r in done) / tokens if tokens else math.nan

    def mean(self, what: Callable[[RequestRecord], float]) -> float:
        """Mean of `what` over served requests."""
        done = self.served
        return math.fsum(what(r) for r in done) / len(done) if done else math.nan

    def summary(self) -> dict[str, float]:
        """The paper's metrics: per-token time, first token, each remaining token, waiting (seconds)."""
        return {
            "per_token_s": self.mean_token_time_s(),
            "first_token_s": self.mean(lambda r: r.first_token_time_s),
            "remaining_token_s": self.mean(lambda r: r.remaining_token_s),
            "waiting_s": self.mean(lambda r: r.waiting_s),
            "max_in_system": float(self.max_in_system),
            "rejected": float(self.rejected),
        }


def poisson_arrivals(rng: np.random.Generator, rate_per_s: float, n: int) -> np.ndarray:
    """`n` Poisson arrival times at `rate_per_s`, the first at t = 0 (as the paper's runs start)."""
    gaps = rng.exponential(1.0 / rate_per_s, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def make_requests(arrivals: Iterable[float], output_len: int, client: int = 0) -> list[SimRequest]:
    """Requests from one client at the given arrival times, all generating `output_len` tokens."""
    return [SimRequest(i, client, float(t), output_len) for i, t in enumerate(arrivals)]


_FINISH, _ARRIVE, _RETRY = 0, 1, 2
_PRIORITY = {_FINISH: 0, _ARRIVE: 1, _RETRY: 1}  # finishes first: caches freed at t serve t's arrivals


def _expected_wait(ledger: CacheLedger, route: Route, now: float) -> float:
    """Eq. (20) on each hop, max over the chain (21b): when the route is expected to have room."""
    waits = []
    for h in route.hops:
        # Eq. (20) reads only the server's cache state; the span's blocks and times are placeholders.
        slots, sessions = ledger.capacity[h.server], ledger.sessions(h.server, now)
        state = SpanInfo(h.server, 0, 1, 0.0, 0.0, cache_slots=slots, sessions=sessions)
        waits.append(waiting_time(state, h.n_blocks))
    return max(waits, default=0.0)


class _Run:
    """One simulation's mutable state: the event heap, the cache ledger, the FIFO queue and the records."""

    def __init__(self, instance: Instance, slots: Sequence[int], router: Router, config: SimConfig) -> None:
        self.instance, self.router, self.config = instance, router, config
        self.ledger = CacheLedger(tuple(int(c) for c in slots))
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, priority, seq, kind, request id)
        self.seq = 0
        self.queue: deque[int] = deque()
        self.records: dict[int, RequestRecord] = {}
        self.in_system = self.max_in_system = 0

    def push(self, when: float, kind: int, rid: int) -> None:
        heapq.heappush(self.events, (when, _PRIORITY[kind], self.seq, kind, rid))
        self.seq += 1

    def durations(self, rec: RequestRecord) -> tuple[float, float]:
        """(admission to first token, admission to last token) on the record's route."""
        assert rec.route is not None
        first = self.config.setup_s + route_first_token_time(self.instance, rec.route)
        return first, first + (rec.request.output_len - 1) * route_token_time(self.instance, rec.route)

    def start(self, rec: RequestRecord, now: float) -> None:
        assert rec.route is not None
        first, total = self.durations(rec)
        rec.start_s, rec.first_token_s, rec.finish_s = now, now + first, now + total
        self.ledger.admit(rec.request.id, rec.route, rec.finish_s)
        self.push(rec.finish_s, _FINISH, rec.request.id)

    def wait(self, rec: RequestRecord, now: float) -> None:
        """Queue (FIFO) or schedule the first retry (backoff), leaving a reservation for the routers' view."""
        assert rec.route is not None
        expected = now + _expected_wait(self.ledger, rec.route, now) + self.durations(rec)[1]
        self.ledger.reserve(rec.request.id, rec.route, expected)
        if self.config.admission == "fifo":
            self.queue.append(rec.request.id)
        else:
            self.push(now + self.config.backoff_first_s, _RETRY, rec.request.id)

    def drain(self, now: float) -> None:
        """Start queued sessions from the head while the head's chain has room (strict FIFO)."""
        while self.queue:
            head = self.records[self.queue[0]]
            if head.route is None or not self.ledger.fits(head.route):
                return
            self.start(self.records[self.queue.popleft()], now)

    def arrive(self, rec: RequestRecord, now: float) -> None:
        route = self.router(rec.request, CacheView(now, self.ledger))
        rec.route = route
        if route is None or not self.ledger.can_ever_fit(route):
            rec.rejected = True
            return
        self.in_system += 1
        self.max_in_system = max(self.max_in_system, self.in_system)
        if not self.queue and self.ledger.fits(route):
            self.start(rec, now)
        else:
            self.wait(rec, now)

    def retry(self, rec: RequestRecord, now: float) -> None:
        assert rec.route is not None
        if self.ledger.fits(rec.route):
            self.start(rec, now)
            return
        rec.retries += 1
        delay = min(self.config.backoff_first_s * 2**rec.retries, self.config.backoff_cap_s)
        self.push(now + delay, _RETRY, rec.request.id)

    def run(self, requests: Sequence[SimRequest]) -> SimResult:
        for req in sorted(requests, key=lambda q: (q.arrival_s, q.id)):
            if req.id in self.records:
                raise ValueError(f"request id {req.id} appears twice")
            self.records[req.id] = RequestRecord(req)
            self.push(req.arrival_s, _ARRIVE, req.id)
        peak = [0] * len(self.ledger.capacity)
        trace: list[tuple[float, tuple[int, ...]]] = []
        while self.events:
            now, _, _, kind, rid = heapq.heappop(self.events)
            rec = self.records[rid]
            if kind == _FINISH:
                self.ledger.release(rid)
                self.in_system -= 1
                self.drain(now)
            elif kind == _ARRIVE:
                self.arrive(rec, now)
            else:
                self.retry(rec, now)
            peak = [max(p, u) for p, u in zip(peak, self.ledger.used, strict=True)]
            if self.config.trace:
                trace.append((now, tuple(self.ledger.used)))
        return SimResult(list(self.records.values()), tuple(peak), self.max_in_system, trace)


def simulate(
    instance: Instance,
    cache_slots: Sequence[int],
    router: Router,
    requests: Sequence[SimRequest],
    config: SimConfig | None = None,
) -> SimResult:
    """Run `requests` through servers holding `cache_slots` caches each, routed at arrival by `router`."""
    if len(cache_slots) != len(instance.servers):
        raise ValueError(f"{len(cache_slots)} cache capacities for {len(instance.servers)} servers")
    return _Run(instance, cache_slots, router, config or SimConfig()).run(requests)
