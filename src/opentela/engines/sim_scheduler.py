"""Token-level scheduling of several model instances sharing one simulated node (LLM-Mesh section 5.1).

The node has one executor. Time advances in iterations, and each iteration belongs to one instance: a prefill of
one waiting request, or one decode step of all its running requests (`headroom.InstanceLoad.next_iteration`). The
next iteration always goes to the instance holding the request with the least headroom (`headroom.pick_instance`),
so a model with a tight TPOT SLO keeps its tokens coming while one with slack absorbs the delay.

`TokenExecutor` makes the decisions and keeps the books without an event loop or a clock of its own, so its choices
can be checked step by step; `TokenScheduler` drives it in real time for the simulated engine's request handlers.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentela._tasks import TaskSet
from opentela.engines.headroom import InstanceLoad, RequestState, pick_instance
from opentela.engines.profile import PerformanceProfile
from opentela.engines.sim_timing import sleep_until

HISTORY = 4096
"""Iterations remembered in `TokenExecutor.history` (older ones are dropped)."""


class SchedulerStoppedError(RuntimeError):
    """The executor stopped while a request still waited for tokens (the engine is shutting down)."""


@dataclass(frozen=True)
class Turn:
    """One iteration the executor ran: whose, what kind, for how many requests, when, how long, and why."""

    model: str
    kind: str
    """"prefill" or "decode"."""
    batch: int
    start: float
    seconds: float
    headroom_s: float
    """The least headroom on the chosen instance when it was chosen (what made it the most urgent)."""


@dataclass
class InstanceStats:
    """What the executor did for one model instance."""

    iterations: int = 0
    prefills: int = 0
    decodes: int = 0
    tokens: int = 0
    """Tokens delivered to requests (a prefill for max_tokens 0 delivers none)."""
    busy_s: float = 0.0
    last_headroom_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form reported by the engine's /health."""
        out: dict[str, Any] = dict(vars(self))
        out["busy_s"] = round(self.busy_s, 6)
        if self.last_headroom_s is not None:
            out["last_headroom_s"] = round(self.last_headroom_s, 6)
        return out


class Ticket:
    """One request's place in the executor: its headroom state, how many tokens it wants, and a wake-up."""

    def __init__(self, model: str, state: RequestState, n_tokens: int) -> None:
        self.model = model
        self.state = state
        self.n_tokens = n_tokens
        # A request for no tokens still has its prompt prefilled: that iteration ends it.
        self.target = max(1, n_tokens)
        self.removed = False
        self.stopped = False
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return f"<Ticket {self.model} {self.state.output_tokens}/{self.n_tokens} removed={self.removed}>"

    def wake(self) -> None:
        """Tell the waiting handler that a token came (or that the executor stopped)."""
        self._changed.set()

    async def token(self, k: int) -> None:
        """Return once token `k` (0-based; 0 is the prefill's) has been produced."""
        while self.state.output_tokens <= k:
            if self.stopped:
                raise SchedulerStoppedError("the token scheduler stopped")
            self._changed.clear()
            await self._changed.wait()


class TokenExecutor:
    """The decisions and the books of one shared executor over named instances (see the module's docstring)."""

    def __init__(self, profiles: Mapping[str, PerformanceProfile], history: int = HISTORY) -> None:
        self.models = list(profiles)
        self._loads = [InstanceLoad(profiles[m]) for m in self.models]
        self._index = {m: i for i, m in enumerate(self.models)}
        # Keyed by the state's identity: RequestState compares by value, and two requests can be equal.
        self._tickets: dict[int, Ticket] = {}
        self.stats = {m: InstanceStats() for m in self.models}
        self.history: collections.deque[Turn] = collections.deque(maxlen=history)

    def __repr__(self) -> str:
        return f"<TokenExecutor {self.models} requests={len(self._tickets)}>"

    def add(self, model: str, state: RequestState, n_tokens: int) -> Ticket:
        """Queue a request on `model`'s instance; its prefill waits for that instance's turn."""
        ticket = Ticket(model, state, n_tokens)
        self._loads[self._index[model]].requests.append(state)
        self._tickets[id(state)] = ticket
        return ticket

    def remove(self, ticket: Ticket) -> None:
        """Take a request off its instance (finished, or its client went away); idempotent."""
        if ticket.removed:
            return
        ticket.removed = True
        load = self._loads[self._index[ticket.model]]
        load.requests[:] = [r for r in load.requests if r is not ticket.state]
        del self._tickets[id(ticket.state)]

    def running(self, model: str) -> int:
        """Requests on `model`'s instance, prefilled or not."""
        return len(self._loads[self._index[model]].requests)

    def next_turn(self, now: float) -> tuple[Turn, list[Ticket]] | None:
        """Choose the next iteration at time `now` and the requests it serves; None when every instance is idle."""
        i = pick_instance(self._loads, now)
        if i is None:
            return None
        load, model = self._loads[i], self.models[i]
        headroom = load.least_headroom(now)
        seconds, served = load.next_iteration()
        kind = "prefill" if served[0].output_tokens == 0 else "decode"
        turn = Turn(model, kind, len(served), now, seconds, headroom)
        stats = self.stats[model]
        stats.iterations += 1
        stats.last_headroom_s = headroom
        if kind == "prefill":
            stats.prefills += 1
        else:
            stats.decodes += 1
        self.history.append(turn)
        return turn, [self._tickets[id(r)] for r in served]

    def finish(self, turn: Turn, served: list[Ticket]) -> list[Ticket]:
        """Book the end of `turn`: each request still there gets its token; those done leave. Returns who to wake."""
        stats = self.stats[turn.model]
        stats.busy_s += turn.seconds
        woken = []
        for ticket in served:
            if ticket.removed:
                continue  # its client left while the iteration ran
            ticket.state.output_tokens += 1
            if ticket.state.output_tokens <= ticket.n_tokens:
                stats.tokens += 1
            if ticket.state.output_tokens >= ticket.target:
                self.remove(ticket)
            woken.append(ticket)
        return woken

    def stop(self) -> None:
        """Wake every waiting request with the news that no more tokens will come."""
        for ticket in list(self._tickets.values()):
            ticket.stopped = True
            ticket.wake()


class TokenScheduler:
    """`TokenExecutor` run in real time: ``async with TokenScheduler(profiles) as s: ticket = s.submit(...)``."""

    def __init__(self, profiles: Mapping[str, PerformanceProfile], history: int = HISTORY) -> None:
        self.executor = TokenExecutor(profiles, history)
        self._work = asyncio.Event()
        self._tasks = TaskSet("token-scheduler")

    def __repr__(self) -> str:
        return f"<TokenScheduler {self.executor!r}>"

    def submit(self, model: str, state: RequestState, n_tokens: int) -> Ticket:
        """Queue a request; await `ticket.token(k)` for its tokens and `remove(ticket)` when done with it."""
        ticket = self.executor.add(model, state, n_tokens)
        self._work.set()
        return ticket

    def remove(self, ticket: Ticket) -> None:
        """Take a request off the executor (a finished one is already gone; a cancelled one stops costing)."""
        self.executor.remove(ticket)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: iterations, prefills, decodes, tokens, busy seconds, last headroom and requests on it."""
        ex = self.executor
        return {m: {**s.as_dict(), "running": ex.running(m)} for m, s in ex.stats.items()}

    async def _run(self) -> None:
        clock: float | None = None
        try:
            while True:
                # While busy, the next iteration starts when the last one was due to end, not when this loop woke
                # up: late wake-ups then do not add up over a long stream.
                now = time.monotonic() if clock is None else clock
                chosen = self.executor.next_turn(now)
                if chosen is None:
                    clock = None
                    self._work.clear()
                    await self._work.wait()
                    continue
                turn, served = chosen
                clock = now + turn.seconds
                await sleep_until(clock)
                # A zero-length iteration must still yield, or handlers never get to write their tokens.
                await asyncio.sleep(0)
                for ticket in self.executor.finish(turn, served):
                    ticket.wake()
        finally:
            self.executor.stop()

    async def start(self) -> None:
        """Start the executor's loop."""
        self._tasks.spawn(self._run(), "token-scheduler")

    async def aclose(self) -> None:
        """Stop the loop; requests still waiting are told so."""
        await self._tasks.aclose(timeout=1.0)
        self.executor.stop()

    async def __aenter__(self) -> TokenScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
