"""The baselines of LLM-Mesh's evaluation: ServerlessLLM (`sllm`), exclusive GPUs, and `sllm+cpu`, also CPU nodes.

Every instance has a node to itself (its engine takes the node's memory for weights and KV cache). A request goes
to the instance of its model with the fewest requests in flight; when even that one has reached the concurrency
threshold and a node is free, a new instance is started there (scale-out), CPU nodes first where they are used. A
model with no instance and no free node waits for one to be recycled. Each engine batches requests from its queue
while its batch and KV cache have room, as vLLM does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentela.scheduler.llm_mesh.cluster import MeshSimulator
from opentela.scheduler.llm_mesh.node import Instance, Node, SimRequest
from opentela.scheduler.llm_mesh.profiles import MAX_BATCH

SLLM_THRESHOLDS = {"cpu": {"3B": 59, "7B": 15, "13B": 6}, "gpu": {"3B": 160, "7B": 32, "13B": 16}}
"""Concurrency at which an instance scales out, per node kind and model size: the paper's tuned values (8.1)."""


@dataclass
class SllmPolicy:
    """ServerlessLLM as the paper runs it; `use_cpu` makes it `sllm+cpu`."""

    sizes: Mapping[int, str]
    """Model index -> "3B" / "7B" / "13B" (picks the thresholds)."""
    use_cpu: bool = False
    thresholds: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: SLLM_THRESHOLDS)
    waiting: deque[SimRequest] = field(default_factory=deque)

    @property
    def name(self) -> str:
        """ "sllm" or "sllm+cpu"."""
        return "sllm+cpu" if self.use_cpu else "sllm"

    def threshold(self, inst: Instance) -> int:
        """The concurrency at which `inst` scales out."""
        return self.thresholds[inst.node.kind][self.sizes[inst.model]]

    def _free_node(self, sim: MeshSimulator) -> Node | None:
        for kind in ("cpu", "gpu") if self.use_cpu else ("gpu",):
            for node in sim.nodes:
                if node.kind == kind and not node.instances:
                    return node
        return None

    def _start(self, sim: MeshSimulator, node: Node, model: int, now: float) -> Instance | None:
        profile = sim.profile(model, node)
        kv = node.memory.capacity - profile.weights_bytes
        return sim.create_instance(node, model, kv, now)

    def dispatch(self, sim: MeshSimulator, req: SimRequest, now: float) -> None:
        """Route to the least-loaded instance of the model, scaling out past the threshold."""
        instances = sim.instances_of(req.model)
        if instances:
            best = min(instances, key=lambda i: (i.inflight, i.iid))
            if best.inflight >= self.threshold(best):
                node = self._free_node(sim)
                fresh = self._start(sim, node, req.model, now) if node is not None else None
                if fresh is not None:
                    best = fresh
            sim.enqueue(req, best)
            self._admit(sim, best, now)
            return
        node = self._free_node(sim)
        inst = self._start(sim, node, req.model, now) if node is not None else None
        if inst is None:
            self.waiting.append(req)
            return
        sim.enqueue(req, inst)

    def _admit(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        if inst.ready_at > now or inst.unloading:
            return
        capacity = inst.kv_bytes() / inst.profile.kv_bytes_per_token
        used = inst.kv_used_tokens() + inst.batch
        gave_up = False
        while inst.queue and inst.batch < MAX_BATCH:
            head = inst.queue[0]
            if now - head.arrival > sim.spec.give_up_s and head.produced == 0:
                inst.queue.popleft()
                head.instance, head.dropped, gave_up = None, True, True
                continue
            if used + head.input_tokens + 1 > capacity:
                break
            inst.queue.popleft()
            used += head.input_tokens + 1
            sim.attach(head, inst, now)
        if gave_up and not inst.load.requests and not inst.queue:
            sim.went_idle(inst, now)

    def on_instance_change(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """Admit queued requests once loaded and after each finish."""
        self._admit(sim, inst, now)

    def on_stall(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """Out of KV blocks: send the newest request back to the queue to be recomputed (vLLM's preemption)."""
        victim = max(inst.members, key=lambda r: r.arrival)
        sim.detach(victim, now)
        victim.migrate()
        victim.instance = inst
        inst.queue.appendleft(victim)

    def on_capacity_freed(self, sim: MeshSimulator, now: float) -> None:
        """A node came free: start an instance for the model that has waited longest."""
        while self.waiting:
            head = self.waiting[0]
            if now - head.arrival > sim.spec.give_up_s:
                self.waiting.popleft().dropped = True
                continue
            node = self._free_node(sim)
            if node is None:
                return
            inst = self._start(sim, node, head.model, now)
            if inst is None:
                return
            for r in [r for r in self.waiting if r.model == head.model]:
                self.waiting.remove(r)
                sim.enqueue(r, inst)
