"""LLM-Mesh's placement: CPU first, shadow validation, bin-packing and proactive preemption (sections 4, 5.3, 6, 7).

A request tries the instances of its model, CPU nodes first and the largest batch first (reactive defragmentation,
7.2). An instance takes it only if the compute subsystem's shadow validation passes (no SLO is broken on the node,
5.3) and the memory subsystem can grow the instance's KV cache to M_recommend, or at least to M_require (6.4).
If none can, an instance may preempt a neighbour on its node with a smaller batch, the smallest first, when the
neighbour's requests validate elsewhere (7.1). Otherwise a new instance is started, CPU nodes first and busy nodes
before empty ones. A request nothing can take waits, retried whenever capacity frees, until its first token could
no longer be on time.

Under the simulator's profiles this placement keeps every admitted request on time, with one exception it handles
the way the paper intends: a decode round grows as contexts grow, which the admission-time validation (10 %
over) cannot see for long outputs. So before each admission and whenever a request finishes, the node's decode round
is re-validated at its current contexts, and when it no longer fits the tightest TPOT, the request with the longest
headroom is evicted and placed elsewhere (6.4's eviction, applied to compute).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from opentela.engines.headroom import OVERESTIMATE, RequestState
from opentela.scheduler.llm_mesh.cluster import MeshSimulator
from opentela.scheduler.llm_mesh.memory import kv_held_bytes, kv_require_bytes
from opentela.scheduler.llm_mesh.node import Instance, Node, SimRequest
from opentela.scheduler.llm_mesh.profiles import MAX_BATCH, MAX_CONTEXT

RETRY_EVERY_S = 0.05
"""Waiting requests are retried at most this often (capacity frees in bursts)."""


@dataclass
class LlmMeshPolicy:
    """LLM-Mesh; the switches turn off its parts for ablations."""

    use_cpu: bool = True
    preemption: bool = True
    bin_packing: bool = True
    pending: deque[SimRequest] = field(default_factory=deque)
    preemptions: int = 0
    evictions: int = 0
    _retry_at: float = -math.inf

    name: str = "llm-mesh"

    # -- memory subsystem --------------------------------------------------------------------------------------

    def _require(self, sim: MeshSimulator, inst_requests: list[RequestState], extra: RequestState | None,
                 bytes_per_token: float) -> float:  # fmt: skip
        reqs = [*inst_requests, extra] if extra is not None else inst_requests
        return kv_require_bytes(reqs, sim.mean_output, MAX_CONTEXT, bytes_per_token)

    def _kv_plan(self, sim: MeshSimulator, inst: Instance, req: SimRequest) -> tuple[bool, float | None]:
        """Whether the memory subsystem can take `req` on `inst`, and the KV size to grow to (None: no growth)."""
        c = inst.profile.kv_bytes_per_token
        require = self._require(sim, list(inst.load.requests), req, c)
        current = inst.kv_target_bytes()
        grow = sim.spec.watermark.grow_to(current, require)
        if grow is None:
            return True, None
        weights = inst.profile.weights_bytes
        if inst.node.memory.can_budget(inst.iid, weights + grow):
            return True, grow
        if inst.node.memory.can_budget(inst.iid, weights + require):
            return True, require  # the compromise of 6.4: M_require instead of M_recommend
        return False, None

    # -- placement ---------------------------------------------------------------------------------------------

    def _candidates(self, sim: MeshSimulator, model: int) -> list[Instance]:
        insts = [i for i in sim.instances_of(model) if self.use_cpu or i.node.kind == "gpu"]
        if self.bin_packing:
            return sorted(insts, key=lambda i: (i.node.kind != "cpu", -i.batch, i.iid))
        return sorted(insts, key=lambda i: (i.node.kind != "cpu", i.batch, i.iid))

    def _round_fits(self, node: Node, without: Instance | None = None) -> bool:
        """Re-validation at current contexts: one decode round of the node within the tightest TPOT."""
        live = [i for i in node.live() if i is not without and i.load.requests]
        if not live:
            return True
        tightest = min(r.slo.tpot_s for i in live for r in i.load.requests)
        return (1 + OVERESTIMATE) * sum(i.load.decode_round() for i in live) <= tightest

    def try_admit(self, sim: MeshSimulator, inst: Instance, req: SimRequest, now: float,
                  commit: bool = True) -> bool:  # fmt: skip
        """Admit `req` to an existing instance if both subsystems validate it."""
        if inst.unloading or inst.batch >= MAX_BATCH:
            return False
        ok, grow = self._kv_plan(sim, inst, req)
        if not ok:
            return False
        memory = inst.node.memory
        if any(op.slot == inst.iid for op in memory.station) or (
            grow is not None and not memory.fits_now(inst.iid, inst.profile.weights_bytes + grow)
        ):
            # A growth that waits (behind the instance's running resize, or for memory) ends at a time nobody
            # knows, and the validation can only play out the cache it can time: the decode steps after its
            # horizon would fill the cache and stall the instance until the growth is done.
            return False
        if not self._round_fits(inst.node):
            return False
        # The instance's KV cache over time, with this admission's resize: while the cache cannot hold the next
        # iteration (the new prefill, say) the whole instance stalls, and the validation plays that stall out.
        kv = sim.kv_steps(inst, grow, now)
        verdict = sim.validate(req, inst.node, inst, now, kv=kv)
        if not verdict.ok:
            return False
        if commit:
            if grow is not None:
                sim.resize(inst, grow, now)
            req.validated = True
            sim.attach(req, inst, now)
        return True

    def _node_order(self, sim: MeshSimulator) -> list[Node]:
        kinds = ("cpu", "gpu") if self.use_cpu else ("gpu",)
        nodes = [n for n in sim.nodes if n.kind in kinds]
        if self.bin_packing:
            return sorted(nodes, key=lambda n: (kinds.index(n.kind), not n.instances, -n.requests, n.name))
        return sorted(nodes, key=lambda n: (kinds.index(n.kind), n.requests, n.name))

    def try_new_instance(self, sim: MeshSimulator, node: Node, req: SimRequest, now: float,
                         commit: bool = True) -> bool:  # fmt: skip
        """Start a new instance of the request's model on `node` for it, if memory and compute validate."""
        profile = sim.profile(req.model, node)
        kv = sim.spec.watermark.recommend(self._require(sim, [], req, profile.kv_bytes_per_token))
        total = profile.weights_bytes + kv
        idle = sorted((i for i in node.live() if not i.load.requests and not i.queue), key=lambda i: i.iid)
        victims: list[Instance] = []
        free = node.memory.capacity - node.memory.held_total
        budget_free = node.memory.capacity - node.memory.budget
        # Idle neighbours only wait for their keep-alive: preempting them costs nothing (7.1 with batch 0).
        while (free < total or budget_free < total) and idle and self.preemption:
            v = idle.pop(0)
            victims.append(v)
            free += node.memory.held.get(v.iid, 0.0)
            budget_free += node.memory.target(v.iid)
        if free < total or budget_free < total:
            return False
        # The load starts once the victims' unloads have freed their memory (summed in the order the events come,
        # so the validation sees the very instant the instance will be ready).
        start = now + sim.spec.cold_start.unload_s if victims else now
        ready_at = start + sim.load_seconds(req.model, node)
        if not self._round_fits(node):
            return False
        verdict = sim.validate(req, node, None, now, ready_at=ready_at, kv=[(ready_at, kv)])
        if not verdict.ok:
            return False
        if commit:
            for v in victims:
                sim.unload(v, now)
            inst = sim.create_instance(node, req.model, kv, now)
            if inst is None:
                return False
            req.validated = True
            sim.attach(req, inst, now)
        return True

    def try_preempt(self, sim: MeshSimulator, inst: Instance, req: SimRequest, now: float) -> bool:
        """Proactive defragmentation: make room on `inst`'s node by evicting one smaller-batch neighbour."""
        node = inst.node
        neighbours = sorted(
            (n for n in node.live() if n is not inst and n.batch < inst.batch and n.load.requests),
            key=lambda n: (n.batch, n.iid),
        )
        for victim in neighbours[:2]:
            c = inst.profile.kv_bytes_per_token
            require = self._require(sim, list(inst.load.requests), req, c)
            weights = inst.profile.weights_bytes
            budget_after = node.memory.budget - node.memory.target(victim.iid) - node.memory.target(inst.iid)
            if budget_after + weights + require > node.memory.capacity:
                continue
            if inst.kv_bytes() < kv_held_bytes(inst.load.requests, c) + c * (
                req.input_tokens + inst.batch + 2
            ):
                continue  # would wait for a resize behind the victim's unload: not predictable enough
            if not self._round_fits(node, without=victim):
                continue
            if not sim.validate(req, node, inst, now, without=victim).ok:
                continue
            moved = list(victim.members)
            if not all(self._placeable_elsewhere(sim, r, node, now) for r in moved):
                continue
            self.preemptions += 1
            for r in moved:
                sim.detach(r, now)
                r.migrate()
            sim.unload(victim, now)
            grow = max(require, min(sim.spec.watermark.recommend(require),
                                    node.memory.capacity - budget_after - weights))  # fmt: skip
            if grow > inst.kv_target_bytes():
                sim.resize(inst, grow, now)
            req.validated = True
            sim.attach(req, inst, now)
            for r in moved:
                self.place(sim, r, now, avoid=node)
            return True
        return False

    def _placeable_elsewhere(self, sim: MeshSimulator, r: SimRequest, avoid: Node, now: float) -> bool:
        probe = SimRequest(
            start=r.start + r.slo.tpot_s * r.output_tokens,
            slo=r.slo,
            input_tokens=r.input_tokens + r.output_tokens,
            model=r.model,
        )
        for other in self._candidates(sim, r.model):
            if other.node is not avoid and self.try_admit(sim, other, probe, now, commit=False):
                return True
        return any(
            self.try_new_instance(sim, n, probe, now, commit=False)
            for n in self._node_order(sim)
            if n is not avoid
        )

    def place(self, sim: MeshSimulator, req: SimRequest, now: float, avoid: Node | None = None) -> bool:
        """Find a home for a request (not on `avoid`, the node it was just moved off), or leave it waiting."""
        candidates = [i for i in self._candidates(sim, req.model) if i.node is not avoid]
        for inst in candidates:
            if self.try_admit(sim, inst, req, now):
                return True
        if self.preemption:
            for inst in candidates:
                if self.try_preempt(sim, inst, req, now):
                    return True
        for node in self._node_order(sim):
            if node is not avoid and self.try_new_instance(sim, node, req, now):
                return True
        self.pending.append(req)
        return False

    # -- the simulator's hooks ---------------------------------------------------------------------------------

    def dispatch(self, sim: MeshSimulator, req: SimRequest, now: float) -> None:
        """A new request: place it or let it wait."""
        self.place(sim, req, now)

    def on_instance_change(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """Lazy KV scale-down after a finish; re-validate the node's decode round."""
        if inst.unloading or inst.ready_at > now:
            return
        c = inst.profile.kv_bytes_per_token
        require = self._require(sim, list(inst.load.requests), None, c)
        current = inst.kv_target_bytes()
        shrink = sim.spec.watermark.shrink_to(current, require)
        if shrink is not None and inst.iid not in inst.node.memory.running:
            sim.resize(inst, shrink, now)
        self._rebalance(sim, inst.node, now)

    def _rebalance(self, sim: MeshSimulator, node: Node, now: float) -> None:
        while not self._round_fits(node):
            victim = max((r for i in node.live() for r in i.members), key=lambda r: r.headroom(now))
            self._evict(sim, victim, now)

    def _evict(self, sim: MeshSimulator, victim: SimRequest, now: float) -> None:
        self.evictions += 1
        node = victim.instance.node if victim.instance is not None else None
        sim.detach(victim, now)
        victim.migrate()
        self.place(sim, victim, now, avoid=node)

    def on_stall(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """The KV cache fell short of an underestimated demand: grow again, else evict the longest headroom."""
        if inst.iid in inst.node.memory.running:
            return  # a resize is under way; the instance resumes when it completes
        c = inst.profile.kv_bytes_per_token
        require = max(
            self._require(sim, list(inst.load.requests), None, c), c * (inst.next_needs_tokens() + inst.batch)
        )
        weights = inst.profile.weights_bytes
        for size in (sim.spec.watermark.recommend(require), require):
            if inst.node.memory.can_budget(inst.iid, weights + size) and sim.resize(inst, size, now):
                return
        victim = max(inst.members, key=lambda r: r.headroom(now))
        self._evict(sim, victim, now)

    def on_capacity_freed(self, sim: MeshSimulator, now: float) -> None:
        """Retry waiting requests (at most every RETRY_EVERY_S); drop those that can no longer be on time."""
        if not self.pending or now < self._retry_at:
            return
        self._retry_at = now + RETRY_EVERY_S
        waiting, self.pending = self.pending, deque()
        failed: set[int] = set()
        for req in waiting:
            if req.headroom(now) < 0:
                req.dropped = True
                continue
            if req.model in failed:
                self.pending.append(req)
                continue
            if not self.place(sim, req, now):
                failed.add(req.model)
        if self.pending:
            sim.later(now + RETRY_EVERY_S, lambda t: self.on_capacity_freed(sim, t))
