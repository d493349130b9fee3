"""Request headroom and shadow validation, as LLM-Mesh defines them (its sections 5.1 and 5.3).

A request that started at ST, has produced O tokens and is held to TTFT and TPOT SLOs may wait until
ST + TTFT_SLO + TPOT_SLO * O before its next token is late; at time CT its headroom is that minus CT (Eq. 1). The
instances sharing one node take turns, one iteration each, and the next turn goes to the instance holding the request
with the least headroom.

Before a request joins an instance, the node's next iterations are simulated with it added (every iteration
overestimated by 10 %, for runtime noise and growing contexts); the request is refused if (1) its own prefill would
finish after its TTFT deadline, (2) a request already running would miss its next token, or (3) one decode round over
all instances on the node would then take longer than the tightest TPOT SLO among them. The same code decides in the
gateway's `slo_headroom` policy, in the simulator and in the simulated engine's token-level scheduler.

The simulation takes the turns in the order the node will take them: an instance that cannot run yet (its model
still loading, or its KV cache too small for its next iteration until a resize completes) rejoins at a fixed time,
and a turn decided at a slightly different moment can go to another instance. So the turns are played at the
profile's times, and the 10 % is charged to each token as a margin instead: a token counts as produced 10 % of the
compute played before it later than the turns put it. Where no instance waits for anything this is the same as
stretching every iteration by 10 %; where one does, it keeps the simulated order equal to the node's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentela.engines.profile import PerformanceProfile

OVERESTIMATE = 0.10
"""Every iteration is taken as this much longer in a shadow validation (LLM-Mesh section 5.3)."""
DECODE_TOKENS_CHECKED = 2
"""Decode tokens of the new request simulated after its prefill (LLM-Mesh's Figure 6 follows two)."""
KV_SLACK_BYTES = 1e-6
"""Rounding slack when comparing the KV cache an iteration needs with what an instance has."""

KvSteps = Sequence[tuple[float, float]]
"""An instance's KV cache over time: (from this time, bytes) steps in time order."""


@dataclass(frozen=True)
class Slo:
    """Time to first token and time per output token allowed, in seconds."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def llm_mesh(cls, input_tokens: int) -> Slo:
        """The SLOs of LLM-Mesh's evaluation: TTFT max(2, L/512) s, TPOT 0.25 s."""
        return cls(max(2.0, input_tokens / 512), 0.25)


@dataclass
class RequestState:
    """One request on an instance: when it started, its SLOs, its prompt and what it produced so far."""

    start: float
    slo: Slo
    input_tokens: int
    output_tokens: int = 0
    """Tokens produced; 0 means the prefill has not run yet."""

    def headroom(self, now: float) -> float:
        """How long its next token may still take (Eq. 1); negative once it is late."""
        return self.start + self.slo.ttft_s + self.slo.tpot_s * self.output_tokens - now

    @property
    def context(self) -> int:
        """Tokens of context the next iteration attends over."""
        return self.input_tokens + self.output_tokens


@dataclass
class InstanceLoad:
    """One instance (a model's engine) on a node and the requests it is running."""

    profile: PerformanceProfile
    requests: list[RequestState] = field(default_factory=list)

    def least_headroom(self, now: float) -> float:
        """The headroom of its most urgent request (infinite when idle)."""
        return min((r.headroom(now) for r in self.requests), default=float("inf"))

    def next_iteration(self) -> tuple[float, list[RequestState]]:
        """The time of its next iteration and the requests that get a token from it: a waiting prefill first (one
        request at a time, oldest first), else one decode step of every running request."""
        waiting = [r for r in self.requests if r.output_tokens == 0]
        if waiting:
            first = min(waiting, key=lambda r: r.start)
            return self.profile.prefill_time(first.input_tokens), [first]
        if not self.requests:
            return 0.0, []
        avg = sum(r.context for r in self.requests) / len(self.requests)
        return self.profile.decode_time(len(self.requests), avg), list(self.requests)

    def next_needs_tokens(self) -> int:
        """KV tokens its requests occupy once its next iteration has run (a request still waiting for its prefill
        holds none yet; the prefill adds its prompt and first token, a decode step one token per request)."""
        held = sum(r.context for r in self.requests if r.output_tokens)
        waiting = [r for r in self.requests if r.output_tokens == 0]
        if waiting:
            return held + min(waiting, key=lambda r: r.start).input_tokens + 1
        return held + len(self.requests)

    def fits(self, kv_bytes: float) -> bool:
        """Whether a KV cache of `kv_bytes` holds what its next iteration adds (else the instance stalls)."""
        return self.next_needs_tokens() * self.profile.kv_bytes_per_token <= kv_bytes + KV_SLACK_BYTES

    def decode_round(self, extra: int = 0) -> float:
        """One decode iteration with `extra` more requests (of average context) than it has."""
        batch = len(self.requests) + extra
        if batch == 0:
            return 0.0
        avg = sum(r.context for r in self.requests) / len(self.requests) if self.requests else 0.0
        return self.profile.decode_time(batch, avg)


@dataclass(frozen=True)
class Validation:
    """The outcome of a shadow validation: ok, or which case failed and for which request."""

    ok: bool
    case: str = ""
    """"" when ok; else "ttft" (case 1), "delays_running" (case 2) or "node_tpot" (case 3)."""
    detail: str = ""


def pick_instance(instances: Sequence[InstanceLoad], now: float) -> int | None:
    """The index of the instance whose turn it is: the one holding the request with the least headroom."""
    busy = [(inst.least_headroom(now), i) for i, inst in enumerate(instances) if inst.requests]
    return min(busy)[1] if busy else None


def shadow_validate(
    instances: Sequence[InstanceLoad],
    target: int,
    new: RequestState,
    now: float,
    overestimate: float = OVERESTIMATE,
    *,
    ready_at: Sequence[float] | None = None,
    until_prefilled: bool = False,
    kv_bytes: Sequence[KvSteps | None] | None = None,
) -> Validation:
    """Whether `new` may join `instances[target]` without an SLO violation (see the module's docstring).

    `ready_at` gives each instance's earliest turn (an instance still loading takes none before); with
    `until_prefilled` the simulation also goes on until every waiting prefill has run, since a prefill the node
    owes can make a request late after the new one's first tokens. `kv_bytes` gives each instance's KV cache over
    time (None: unbounded): an instance whose next iteration does not fit takes no turn until its cache has grown,
    as on the node; a watched request stuck behind a cache that never grows fails the validation."""
    factor = 1.0 + overestimate
    # Case 3 first (no simulation needed): the decode round of the whole node with the new request in its batch.
    slowest_allowed = min([new.slo.tpot_s, *(r.slo.tpot_s for inst in instances for r in inst.requests)])
    round_s = factor * sum(
        inst.decode_round(extra=1 if i == target else 0) for i, inst in enumerate(instances)
    )
    if round_s > slowest_allowed:
        return Validation(
            False, "node_tpot", f"a decode round would take {round_s:.3f} s > {slowest_allowed} s"
        )
    # Cases 1 and 2: play the node's next turns forward on copies, the new request added to its target. Requests
    # already late before it came are not counted against it.
    shadow = [InstanceLoad(inst.profile, [_copy(r) for r in inst.requests]) for inst in instances]
    ghost = _copy(new)
    shadow[target].requests.append(ghost)
    watched = [
        ghost,
        *(r for inst in shadow for r in inst.requests if r is not ghost and r.headroom(now) >= 0),
    ]
    ready = list(ready_at) if ready_at is not None else [now] * len(shadow)
    untimed = {id(r) for i, inst in enumerate(shadow) if not math.isfinite(ready[i]) for r in inst.requests}
    if any(id(r) in untimed for r in watched if r is not ghost):
        # Its instance will take turns from a moment nobody knows yet (a load waiting for memory): the turns it
        # will compete for cannot be played, so nothing may join the node before they can.
        return Validation(
            False, "delays_running", "a running request waits for a load with no start time yet"
        )
    clock = now
    charged = 0.0  # the overestimate of the compute played so far, added to every token's time when checked
    goal = ghost.output_tokens + 1 + DECODE_TOKENS_CHECKED
    caches = list(kv_bytes) if kv_bytes is not None else [None] * len(shadow)
    for _ in range(MAX_TURNS):
        if ghost.output_tokens >= goal and not (until_prefilled and _owed(shadow, ready, caches, clock)):
            return (
                _settled(shadow, ready, caches, clock, watched, ghost)
                if until_prefilled
                else Validation(True)
            )
        runnable = [
            inst if ready[i] <= clock and _fits(inst, caches[i], clock) else InstanceLoad(inst.profile)
            for i, inst in enumerate(shadow)
        ]
        turn = pick_instance(runnable, clock)
        served: list[RequestState] = []
        if turn is None:
            later = [
                _release(ready[i], caches[i], clock)
                for i, inst in enumerate(shadow)
                if inst.requests and runnable[i] is not inst
            ]
            if not later or not math.isfinite(min(later)):
                return _stuck(shadow, ready, watched, ghost, target)
            clock = min(later)
        else:
            seconds, served = shadow[turn].next_iteration()
            clock += seconds
            charged += seconds * overestimate
        for r in watched:
            late = -r.headroom(clock + charged)
            if late > 0:
                if r is not ghost:
                    return Validation(
                        False, "delays_running", f"a running request would be {late:.3f} s late"
                    )
                if r.output_tokens == 0:
                    return Validation(
                        False, "ttft", f"the new request's first token would be {late:.3f} s late"
                    )
                return Validation(False, "node_tpot", f"the new request's token would be {late:.3f} s late")
        for r in served:
            r.output_tokens += 1
    return Validation(True)


MAX_TURNS = 10_000
"""A bound on the turns one validation plays (each turn gives a token to at least one request)."""


def _owed(
    shadow: Sequence[InstanceLoad], ready: Sequence[float], caches: Sequence[KvSteps | None], clock: float
) -> bool:
    """Whether the node still owes a prefill, or an instance with requests has yet to load or to see its KV
    cache change (a shrink queued behind a resize can leave it too small for what it already holds)."""
    for i, inst in enumerate(shadow):
        if not inst.requests or not math.isfinite(ready[i]):
            continue
        if ready[i] > clock or any(r.output_tokens == 0 for r in inst.requests):
            return True
        if any(since > clock for since, _ in caches[i] or ()):
            return True
    return False


def _settled(
    shadow: Sequence[InstanceLoad],
    ready: Sequence[float],
    caches: Sequence[KvSteps | None],
    clock: float,
    watched: Sequence[RequestState],
    ghost: RequestState,
) -> Validation:
    """Once nothing is owed or pending: an instance whose KV cache cannot hold its next iteration will stall
    until a resize nobody has issued yet completes, so a watched request on one fails the validation."""
    ids = {id(r) for r in watched}
    for i, inst in enumerate(shadow):
        if ready[i] <= clock and not _fits(inst, caches[i], clock):
            if id(ghost) in {id(r) for r in inst.requests}:
                return Validation(False, "node_tpot", "the new request's instance would stall (KV cache)")
            if any(id(r) in ids for r in inst.requests):
                return Validation(False, "delays_running", "a running request would stall (KV cache)")
    return Validation(True)


def _capacity(steps: KvSteps | None, clock: float) -> float:
    if steps is None:
        return math.inf
    size = 0.0
    for since, value in steps:
        if since > clock:
            break
        size = value
    return size


def _fits(inst: InstanceLoad, steps: KvSteps | None, clock: float) -> bool:
    return steps is None or inst.fits(_capacity(steps, clock))


def _release(ready: float, steps: KvSteps | None, clock: float) -> float:
    """When a blocked instance may next take a turn: once loaded, else at its cache's next change."""
    if ready > clock:
        return ready
    return min((since for since, _ in steps or () if since > clock), default=math.inf)


def _stuck(
    shadow: Sequence[InstanceLoad],
    ready: Sequence[float],
    watched: Sequence[RequestState],
    ghost: RequestState,
    target: int,
) -> Validation:
    """No instance can take a turn now or later: fine unless a watched request waits on one of them."""
    if not math.isfinite(ready[target]):
        return Validation(False, "ttft", "the target instance has no load time yet")
    waiting = {id(r) for inst in shadow for r in inst.requests}
    if id(ghost) in waiting:
        return Validation(False, "ttft", "the new request's instance would stall for good (KV cache)")
    if any(id(r) in waiting for r in watched):
        return Validation(False, "delays_running", "a running request would stall for good (KV cache)")
    return Validation(True)


def _copy(r: RequestState) -> RequestState:
    return RequestState(r.start, r.slo, r.input_tokens, r.output_tokens)
