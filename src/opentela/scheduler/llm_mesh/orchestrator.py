"""A node's memory operations ordered as LLM-Mesh's section 6.3 does: optimistic budget, pessimistic tracking, and
a reservation station, after Tomasulo's algorithm.

Loads, unloads and KV resizes of the instances on a node take time and overlap. Each instance is a slot with a
size. A request to change a slot's size is first checked against the optimistic budget (the sum of every slot's
latest target): a shrink lowers the budget at once, a growth is refused if the budget cannot take it. An accepted
operation then executes only when it cannot cause an out-of-memory: the pessimistic tracker counts a shrinking slot
at its old size until the shrink completes, and a growing slot at its new size from the moment it starts. A growth
that does not fit yet waits in the reservation station, which is re-examined whenever an operation completes.
Operations on one slot run in the order they were issued, and a new size for a slot whose previous change has not
started yet replaces it. Since the budget never exceeds the capacity, the station then always drains once the
operations ahead of it complete.

The orchestrator keeps no clock: `submit` and `complete` return the operations that start, and the caller
completes each after its `seconds`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

EPSILON = 1e-6
"""Bytes of slack when comparing sums of floats against the capacity."""


@dataclass(eq=False)
class MemoryOp:
    """One change of a slot's size; `old` and `seconds` are known once it starts."""

    op_id: int
    slot: Hashable
    new: float
    old: float = 0.0
    seconds: float = 0.0
    started: bool = False
    done: bool = False
    fixed_seconds: float | None = None
    """A duration set by the caller (a model load), instead of the resize cost."""

    @property
    def grows(self) -> bool:
        """Whether it needs more memory than the slot had."""
        return self.new > self.old

    def __repr__(self) -> str:
        state = "done" if self.done else "running" if self.started else "reserved"
        return f"<MemoryOp {self.op_id} {self.slot!r} {self.old / 1e9:.2f}->{self.new / 1e9:.2f} GB {state}>"


@dataclass
class MemoryOrchestrator:
    """The memory operations of one node (see the module's docstring). Sizes in bytes."""

    capacity: float
    cost: Callable[[float, float], float]
    """Seconds for a slot to go from an old size to a new one."""
    budget: float = 0.0
    targets: dict[Hashable, float] = field(default_factory=dict)
    """Each slot's size once all its issued operations complete (sums to `budget`)."""
    sizes: dict[Hashable, float] = field(default_factory=dict)
    """Each slot's size after its completed operations."""
    held: dict[Hashable, float] = field(default_factory=dict)
    """What each slot may occupy now (pessimistic)."""
    running: dict[Hashable, MemoryOp] = field(default_factory=dict)
    station: list[MemoryOp] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __repr__(self) -> str:
        return (
            f"<MemoryOrchestrator {self.held_total / 1e9:.1f}/{self.capacity / 1e9:.1f} GB held, "
            f"budget {self.budget / 1e9:.1f} GB, {len(self.running)} running, {len(self.station)} reserved>"
        )

    @property
    def held_total(self) -> float:
        """Memory that may be occupied now, counting every operation in flight at its worst."""
        return sum(self.held.values())

    def target(self, slot: Hashable) -> float:
        """The slot's size once its issued operations complete."""
        return self.targets.get(slot, 0.0)

    def can_budget(self, slot: Hashable, new: float) -> bool:
        """Whether the budget can take the slot going to `new` bytes."""
        return self.budget - self.target(slot) + new <= self.capacity + EPSILON

    def fits_now(self, slot: Hashable, new: float) -> bool:
        """Whether a growth of the slot to `new` would start at once (pessimistic room, nothing ahead of it)."""
        if slot in self.running or any(op.slot == slot for op in self.station):
            return False
        return self.held_total - self.held.get(slot, 0.0) + new <= self.capacity + EPSILON

    def submit(
        self, slot: Hashable, new: float, seconds: float | None = None
    ) -> tuple[MemoryOp | None, list[MemoryOp]]:
        """Issue a change of `slot` to `new` bytes taking `seconds` (default: the resize cost): the operation
        (None if the budget refuses it) and the operations that start now (it, unless it waits in the station)."""
        if new > self.target(slot) and not self.can_budget(slot, new):
            return None, []
        self.budget += new - self.target(slot)
        self.targets[slot] = new
        waiting = next((op for op in self.station if op.slot == slot), None)
        if waiting is not None:
            # The latest size wins, as a register renamed in Tomasulo's scheme: a superseded size that never
            # started is never needed, and running it could wait forever for memory the later one frees.
            waiting.new = new
            if seconds is not None:
                waiting.fixed_seconds = max(seconds, waiting.fixed_seconds or 0.0)
            return waiting, self._dispatch()
        op = MemoryOp(next(self._ids), slot, new, fixed_seconds=seconds)
        self.station.append(op)
        return op, self._dispatch()

    def complete(self, op: MemoryOp) -> list[MemoryOp]:
        """Mark a running operation done; returns the reserved operations that start now."""
        if not op.started or op.done or self.running.get(op.slot) is not op:
            raise ValueError(f"{op!r} is not running")
        op.done = True
        del self.running[op.slot]
        self.sizes[op.slot] = op.new
        self.held[op.slot] = op.new
        if op.new == 0 and self.target(op.slot) == 0 and not any(o.slot == op.slot for o in self.station):
            for table in (self.sizes, self.held, self.targets):
                table.pop(op.slot, None)
        return self._dispatch()

    def _dispatch(self) -> list[MemoryOp]:
        started = []
        blocked: set[Hashable] = set()
        for op in list(self.station):
            if op.slot in blocked or op.slot in self.running:
                blocked.add(op.slot)  # keep the slot's own operations in issue order
                continue
            old = self.sizes.get(op.slot, 0.0)
            if (
                op.new > old
                and self.held_total - self.held.get(op.slot, 0.0) + op.new > self.capacity + EPSILON
            ):
                blocked.add(op.slot)
                continue
            self.station.remove(op)
            op.old, op.started = old, True
            op.seconds = self.cost(old, op.new) if op.fixed_seconds is None else op.fixed_seconds
            # A growth holds its new size from the start; a shrink keeps the old one until it completes.
            self.held[op.slot] = max(old, op.new)
            self.running[op.slot] = op
            started.append(op)
        return started
