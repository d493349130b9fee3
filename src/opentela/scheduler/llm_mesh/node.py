"""Nodes that run several model instances, taking turns one iteration at a time by shortest headroom (LLM-Mesh 5.1).

A node's compute goes to one instance at a time: it runs one iteration of that instance's batch (a prefill of one
waiting request, else one decode step of all its requests), then the next turn goes to the instance holding the
request with the least headroom (Eq. 1). An instance takes turns only once loaded, and only while its KV cache can
hold what the iteration adds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from opentela.engines.headroom import InstanceLoad, RequestState, pick_instance
from opentela.engines.profile import PerformanceProfile
from opentela.scheduler.llm_mesh.orchestrator import MemoryOrchestrator


@dataclass(eq=False)
class SimRequest(RequestState):
    """A request in the simulation: its headroom state plus identity, target length and what happened to it."""

    rid: int = 0
    model: int = 0
    arrival: float = 0.0
    target_tokens: int = 1
    produced: int = 0
    """Tokens delivered so far (across migrations; `output_tokens` counts since the last prefill)."""
    first_token: float = math.nan
    finish: float = math.nan
    validated: bool = False
    """Admitted after a shadow validation (LLM-Mesh); law (a) watches these."""
    late_tokens: int = 0
    worst_headroom: float = math.inf
    migrations: int = 0
    dropped: bool = False
    served_on: str = ""
    """"cpu" or "gpu": the kind of node that produced its first token."""
    instance: Instance | None = field(default=None, repr=False)

    __eq__ = object.__eq__  # identity: two requests with equal fields are still two requests
    __hash__ = object.__hash__

    def migrate(self) -> None:
        """Restart on another instance: re-prefill prompt and output so far, keeping the next token's deadline."""
        self.start += self.slo.tpot_s * self.output_tokens
        self.input_tokens += self.output_tokens
        self.output_tokens = 0
        self.migrations += 1

    @property
    def waiting_prefill(self) -> bool:
        """Whether its (re-)prefill has not run yet."""
        return self.output_tokens == 0


@dataclass(eq=False)
class Instance:
    """One model's engine on a node: its requests (as an InstanceLoad), load state and admission queue."""

    iid: int
    model: int
    node: Node
    profile: PerformanceProfile
    load: InstanceLoad
    ready_at: float = math.inf
    """When its weights are in place (infinite while the load waits in the reservation station)."""
    unloading: bool = False
    idle_since: float = 0.0
    queue: deque[SimRequest] = field(default_factory=deque)
    """Requests routed here but not yet in the batch (the baselines' engine queue)."""

    def __repr__(self) -> str:
        return f"<Instance {self.iid} model {self.model} on {self.node.name} batch {self.batch}>"

    @property
    def members(self) -> list[SimRequest]:
        """Its running batch as the simulator's requests (the simulator only ever puts SimRequests there)."""
        return cast(list[SimRequest], self.load.requests)

    @property
    def batch(self) -> int:
        """Requests in its running batch."""
        return len(self.load.requests)

    @property
    def inflight(self) -> int:
        """Requests routed to it: in the batch or queued."""
        return len(self.load.requests) + len(self.queue)

    def kv_bytes(self) -> float:
        """KV cache it can use now: its slot's completed size minus the weights."""
        return max(0.0, self.node.memory.sizes.get(self.iid, 0.0) - self.profile.weights_bytes)

    def kv_target_bytes(self) -> float:
        """KV cache it will have once its issued memory operations complete."""
        return max(0.0, self.node.memory.target(self.iid) - self.profile.weights_bytes)

    def kv_used_tokens(self) -> int:
        """Tokens of KV cache its requests occupy now (a request waiting for its prefill holds none yet)."""
        return sum(r.input_tokens + r.output_tokens for r in self.load.requests if r.output_tokens)

    def next_needs_tokens(self) -> int:
        """KV tokens occupied after its next iteration (the prefill it would run, else one decode step)."""
        return self.load.next_needs_tokens()


@dataclass(eq=False)
class Node:
    """A CPU or GPU node: its instances, its memory orchestrator and the iteration it is running."""

    name: str
    kind: str
    """"cpu" or "gpu"."""
    memory: MemoryOrchestrator
    instances: list[Instance] = field(default_factory=list)
    busy_until: float = 0.0
    running: tuple[Instance, list[RequestState]] | None = None
    deciding: bool = False
    """A turn decision is scheduled (it runs after the other events of the same instant)."""
    used_since: float | None = None
    used_s: float = 0.0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    busy_s: float = 0.0

    def __repr__(self) -> str:
        return f"<Node {self.name} {len(self.instances)} instances, {self.memory!r}>"

    @property
    def requests(self) -> int:
        """Requests in the batches of all its instances."""
        return sum(i.batch for i in self.instances)

    def live(self) -> list[Instance]:
        """Instances that take part in scheduling (not being unloaded)."""
        return [i for i in self.instances if not i.unloading]

    def mark_used(self, now: float, window: float) -> None:
        """Account its in-use time (any instance on it) up to `now`, within the measured window."""
        in_use = bool(self.instances)
        if self.used_since is not None and not in_use:
            self.used_s += max(0.0, min(now, window) - min(self.used_since, window))
            self.used_since = None
        elif self.used_since is None and in_use:
            self.used_since = now

    def next_turn(self, now: float) -> tuple[Instance | None, list[Instance]]:
        """The instance whose iteration runs next (least headroom among the runnable), and the instances that
        cannot run because their KV cache is too small for their next iteration."""
        runnable, stalled = [], []
        for inst in self.instances:
            if inst.unloading or not inst.load.requests or inst.ready_at > now:
                continue
            if not inst.load.fits(inst.kv_bytes()):
                stalled.append(inst)
                continue
            runnable.append(inst)
        if not runnable:
            return None, stalled
        if len(runnable) == 1:
            return runnable[0], stalled
        turn = pick_instance([i.load for i in runnable], now)
        return (runnable[turn] if turn is not None else None), stalled
