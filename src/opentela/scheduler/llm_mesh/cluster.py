"""The discrete-event simulation of serverless LLM serving on shared CPU and GPU nodes (LLM-Mesh's section 8 setup).

Requests arrive per model; a placement policy (`policies`) routes each to an instance, starts instances (a cold
start from the host-memory cache), resizes their KV caches and evicts; the nodes run their instances' iterations
(`node`), every memory operation goes through the node's orchestrator (`orchestrator`), and an instance left idle for
the keep-alive is recycled. The simulator records per request when each token came and per node how long it was in
use and how many tokens it decoded.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from opentela.engines.headroom import InstanceLoad, KvSteps, RequestState, Slo, Validation, shadow_validate
from opentela.engines.profile import PerformanceProfile
from opentela.scheduler.hardware import GIB, builtin_catalog
from opentela.scheduler.llm_mesh.memory import ColdStart, ScalingCost, Watermark
from opentela.scheduler.llm_mesh.node import Instance, Node, SimRequest
from opentela.scheduler.llm_mesh.orchestrator import MemoryOp, MemoryOrchestrator
from opentela.scheduler.llm_mesh.profiles import CPU_NODE, GPU_NODE, simulated_profile
from opentela.scheduler.workload import Trace


@dataclass(frozen=True)
class ClusterSpec:
    """The nodes and the serverless platform's settings."""

    cpu_nodes: int = 4
    gpu_nodes: int = 4
    cpu_device: str = CPU_NODE
    gpu_device: str = GPU_NODE
    memory_utilization: float = 0.9
    """Share of a node's memory the serving engines may use."""
    keep_alive_s: float = 1.0
    """An instance idle this long is recycled (the paper's 1 s)."""
    give_up_s: float = 60.0
    """A request with no first token this long after it arrived is dropped (its client gives up)."""
    noise: float = 0.0
    """Real iterations take the profile's time times 1 + U(-noise, noise); 0 runs exactly to the profile."""
    cold_start: ColdStart = field(default_factory=ColdStart)
    scaling: ScalingCost = field(default_factory=ScalingCost)
    watermark: Watermark = field(default_factory=Watermark)


class ServingPolicy(Protocol):
    """Where requests go: called by the simulator on arrivals and whenever capacity may have freed."""

    @property
    def name(self) -> str:
        """The policy's name in results."""

    def dispatch(self, sim: MeshSimulator, req: SimRequest, now: float) -> None:
        """Place a newly arrived request (or queue it)."""

    def on_instance_change(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """An instance got ready or finished a request: admit queued requests, shrink its KV cache, ..."""

    def on_stall(self, sim: MeshSimulator, inst: Instance, now: float) -> None:
        """An instance's KV cache cannot hold its next iteration."""

    def on_capacity_freed(self, sim: MeshSimulator, now: float) -> None:
        """Memory or compute was freed somewhere: retry what waits."""


ARRIVAL, TURN_DONE, MEMORY_DONE, KEEP_ALIVE, DECIDE = range(5)


@dataclass
class Outcome:
    """What one run produced, per request and per node."""

    requests: list[SimRequest]
    nodes: list[Node]
    window_s: float
    timeline: list[tuple[float, int, int]]
    """(time, CPU nodes in use, GPU nodes in use) at every change."""
    policy: str

    def slo_compliant(self) -> np.ndarray:
        """Per request: finished with every token on time by Eq. 1, i.e. token i (from 0) by arrival + TTFT_SLO +
        i * TPOT_SLO (a token early banks time for the next, as LLM-Mesh's headroom counts)."""
        return np.array(
            [not r.dropped and math.isfinite(r.finish) and r.worst_headroom >= -1e-9 for r in self.requests],
            dtype=bool,
        )

    def ttft_and_mean_tpot_compliant(self) -> np.ndarray:
        """Per request: first token within the TTFT SLO and mean time per later token within the TPOT SLO (the
        stricter reading used by DistServe; reported next to the paper's)."""
        out = np.zeros(len(self.requests), dtype=bool)
        for i, r in enumerate(self.requests):
            if r.dropped or not math.isfinite(r.finish):
                continue
            ttft = r.first_token - r.arrival
            tpot = (r.finish - r.first_token) / (r.target_tokens - 1) if r.target_tokens > 1 else 0.0
            out[i] = ttft <= r.slo.ttft_s + 1e-9 and tpot <= r.slo.tpot_s + 1e-9
        return out

    def ttft(self) -> np.ndarray:
        """Time to first token per request (inf where it never came)."""
        return np.array(
            [r.first_token - r.arrival if math.isfinite(r.first_token) else math.inf for r in self.requests]
        )

    def nodes_used(self, kind: str) -> float:
        """Average number of nodes of `kind` in use (hosting any instance) over the window."""
        used = sum(n.used_s for n in self.nodes if n.kind == kind)
        return used / self.window_s if self.window_s > 0 else 0.0

    def decode_throughput(self, kind: str) -> float:
        """Decode tokens per second per node of `kind` while in use."""
        used = sum(n.used_s for n in self.nodes if n.kind == kind)
        return sum(n.decode_tokens for n in self.nodes if n.kind == kind) / used if used else 0.0


class MeshSimulator:
    """One run: a trace of requests for `models` (catalog names by model index) served under `policy`."""

    def __init__(
        self,
        spec: ClusterSpec,
        models: Sequence[str],
        trace: Trace,
        policy: ServingPolicy,
        mean_output: float,
        rng: np.random.Generator,
        profile_of: Callable[[str, str], PerformanceProfile] = simulated_profile,
    ) -> None:
        self.spec, self.models, self.policy, self.mean_output, self.rng = (
            spec,
            models,
            policy,
            mean_output,
            rng,
        )
        self._profile_of = profile_of
        catalog = builtin_catalog()
        self.nodes: list[Node] = []
        for kind, count, device in (
            ("cpu", spec.cpu_nodes, spec.cpu_device),
            ("gpu", spec.gpu_nodes, spec.gpu_device),
        ):
            capacity = catalog[device].memory_gib * GIB * spec.memory_utilization
            for i in range(count):
                memory = MemoryOrchestrator(capacity, spec.scaling.seconds)
                self.nodes.append(Node(f"{kind}{i}", kind, memory))
        self.device_of = {"cpu": spec.cpu_device, "gpu": spec.gpu_device}
        self.requests = [
            SimRequest(
                start=float(trace.arrival[i]),
                slo=Slo.llm_mesh(int(trace.input_len[i])),
                input_tokens=int(trace.input_len[i]),
                rid=i,
                model=int(trace.model[i]),
                arrival=float(trace.arrival[i]),
                target_tokens=max(1, int(trace.output_len[i])),
            )
            for i in range(len(trace))
        ]
        self.window_s = float(trace.arrival.max()) if len(trace) else 0.0
        self.by_model: dict[int, list[Instance]] = {}
        self.op_end: dict[MemoryOp, float] = {}
        self.op_instance: dict[MemoryOp, Instance] = {}
        self.timeline: list[tuple[float, int, int]] = [(0.0, 0, 0)]
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._iids = itertools.count()
        self.now = 0.0

    # -- events --------------------------------------------------------------------------------------------------

    def at(self, time: float, kind: int, payload: Any) -> None:
        """Schedule an event."""
        heapq.heappush(self._events, (time, next(self._seq), kind, payload))

    def run(self, window_s: float | None = None, drain_s: float = 300.0) -> Outcome:
        """Simulate every arrival, then let work drain for up to `drain_s`; node use is measured up to the
        last arrival (or `window_s`)."""
        if window_s is not None:
            self.window_s = window_s
        for r in self.requests:
            self.at(r.arrival, ARRIVAL, r)
        stop = self.window_s + drain_s
        while self._events:
            time, _, kind, payload = heapq.heappop(self._events)
            if time > stop:
                break
            self.now = time
            if kind == ARRIVAL:
                self.policy.dispatch(self, payload, time)
            elif kind == TURN_DONE:
                self._turn_done(payload, time)
            elif kind == MEMORY_DONE:
                self._memory_done(payload, time)
            elif kind == KEEP_ALIVE:
                self._keep_alive(payload[0], payload[1], time)
            elif kind == DECIDE:
                payload.deciding = False
                self._decide(payload, time)
            else:
                payload(time)
        for r in self.requests:
            if not math.isfinite(r.first_token):
                r.dropped = True
        for n in self.nodes:
            if n.used_since is not None:
                n.used_s += max(0.0, self.window_s - min(n.used_since, self.window_s))
                n.used_since = None
        return Outcome(self.requests, self.nodes, self.window_s, self.timeline, self.policy.name)

    def _record_use(self, node: Node, now: float) -> None:
        node.mark_used(now, self.window_s)
        cpu = sum(1 for n in self.nodes if n.kind == "cpu" and n.instances)
        gpu = sum(1 for n in self.nodes if n.kind == "gpu" and n.instances)
        if (cpu, gpu) != self.timeline[-1][1:]:
            self.timeline.append((now, cpu, gpu))

    # -- services for policies -----------------------------------------------------------------------------------

    def profile(self, model: int, node: Node) -> PerformanceProfile:
        """The profile of a model index on a node's kind of hardware."""
        return self._profile_of(self.models[model], self.device_of[node.kind])

    def instances_of(self, model: int) -> list[Instance]:
        """Live instances of a model (loading or loaded, not being unloaded)."""
        return self.by_model.get(model, [])

    def load_seconds(self, model: int, node: Node) -> float:
        """Cold-start time of a model on a node."""
        return self.spec.cold_start.seconds(self.profile(model, node).weights_bytes, node.kind)

    def create_instance(self, node: Node, model: int, kv_bytes: float, now: float) -> Instance | None:
        """Start loading a model with `kv_bytes` of KV cache on `node`; None if the memory budget refuses it."""
        profile = self.profile(model, node)
        iid = next(self._iids)
        op, started = node.memory.submit(
            iid, profile.weights_bytes + kv_bytes, seconds=self.load_seconds(model, node)
        )
        if op is None:
            return None
        inst = Instance(iid, model, node, profile, InstanceLoad(profile), idle_since=now)
        node.instances.append(inst)
        self.by_model.setdefault(model, []).append(inst)
        self.op_instance[op] = inst
        self._record_use(node, now)
        self._started(node, started, now)
        return inst

    def resize(self, inst: Instance, kv_bytes: float, now: float) -> MemoryOp | None:
        """Issue a KV resize of an instance; None if the budget refuses it."""
        op, started = inst.node.memory.submit(
            inst.iid, inst.profile.weights_bytes + kv_bytes, seconds=self.resize_seconds(inst, kv_bytes)
        )
        if op is not None:
            self._started(inst.node, started, now)
        return op

    def settle_memory(self, now: float) -> None:
        """Complete every memory operation in flight at `now`, as if their time had passed (sets up scenarios)."""
        for node in self.nodes:
            while node.memory.running:
                op = next(iter(node.memory.running.values()))
                self._events = [e for e in self._events if not (e[2] == MEMORY_DONE and e[3][1] is op)]
                heapq.heapify(self._events)
                self._memory_done((node, op), now)

    def resize_seconds(self, inst: Instance, kv_bytes: float) -> float:
        """Time to resize an instance's KV cache from its current size (the weights stay where they are)."""
        return self.spec.scaling.seconds(inst.kv_bytes(), kv_bytes)

    def unload(self, inst: Instance, now: float) -> None:
        """Recycle an instance (its requests must have left); its memory frees when the unload completes."""
        inst.unloading = True
        self.by_model[inst.model].remove(inst)
        op, started = inst.node.memory.submit(inst.iid, 0.0, seconds=self.spec.cold_start.unload_s)
        assert op is not None  # a shrink is never refused
        self.op_instance[op] = inst
        self._started(inst.node, started, now)

    def attach(self, req: SimRequest, inst: Instance, now: float) -> None:
        """Put a request into an instance's running batch."""
        req.instance = inst
        inst.load.requests.append(req)
        self.kick(inst.node, now)

    def detach(self, req: SimRequest, now: float) -> Instance | None:
        """Take a request out of its instance (finished, evicted or migrated)."""
        inst = req.instance
        if inst is None:
            return None
        if req in inst.load.requests:
            inst.load.requests.remove(req)
        elif req in inst.queue:
            inst.queue.remove(req)
        req.instance = None
        if not inst.load.requests and not inst.queue:
            self.went_idle(inst, now)
        return inst

    def went_idle(self, inst: Instance, now: float) -> None:
        """Start an instance's keep-alive: it is recycled unless a request comes within it."""
        inst.idle_since = now
        self.at(now + self.spec.keep_alive_s, KEEP_ALIVE, (inst, now))

    def enqueue(self, req: SimRequest, inst: Instance) -> None:
        """Route a request to an instance's queue (the baselines' engines admit from it)."""
        req.instance = inst
        inst.queue.append(req)

    def later(self, time: float, action: Callable[[float], None]) -> None:
        """Run `action(time)` at `time`."""
        self.at(time, 99, action)

    def validate(
        self,
        req: SimRequest,
        node: Node,
        target: Instance | None,
        now: float,
        ready_at: float = 0.0,
        without: Instance | None = None,
        kv: KvSteps | None = None,
    ) -> Validation:
        """Shadow-validate `req` joining `target` on `node` (None: a new instance of its model, ready at
        `ready_at`), optionally with the instance `without` gone. `kv` is the KV cache the target will have over
        time once the admission's own resize is issued (default: as its memory operations stand; for a new
        instance, unbounded).

        The simulation replays what the node will do: it starts when the running iteration ends, with that
        iteration's tokens delivered (they are on their way; counting them as still owed would make the requests
        they go to look late and drop them from the check), gives no turn to an instance before it is loaded or
        while its KV cache cannot hold its next iteration, and runs until every prefill the node owes and every
        timed load and resize is done."""
        live = [i for i in node.live() if i is not without]
        loads = [self._after_running(i) for i in live]
        ready = [i.ready_at for i in live]
        caches: list[KvSteps | None] = [self.kv_steps(i) for i in live]
        if target is None:
            loads.append(InstanceLoad(self.profile(req.model, node)))
            ready.append(ready_at)
            caches.append(kv)
            index = len(loads) - 1
        else:
            index = live.index(target)
            if kv is not None:
                caches[index] = kv
        start = max(now, node.busy_until)
        return shadow_validate(
            loads, index, req, start, ready_at=ready, until_prefilled=True, kv_bytes=caches
        )

    def _after_running(self, inst: Instance) -> InstanceLoad:
        """An instance's load as it will be when the node's running iteration ends (copies where it changes)."""
        running = inst.node.running
        if running is None or running[0] is not inst:
            return inst.load
        served = {id(r) for r in running[1]}
        return InstanceLoad(
            inst.profile,
            [
                RequestState(r.start, r.slo, r.input_tokens, r.output_tokens + (id(r) in served))
                for r in inst.load.requests
            ],
        )

    def kv_steps(
        self, inst: Instance, grow: float | None = None, now: float = 0.0
    ) -> list[tuple[float, float]]:
        """An instance's KV cache over time as its memory operations tell: its size now, then what its running
        operation leaves (less if a shrink is queued behind it). With `grow`, a resize to that size issued at
        `now`, if it would start at once. An operation waiting for memory has no known end: the cache is taken
        to stay as it is until then, which can only make a validation stricter."""
        memory = inst.node.memory
        weights = inst.profile.weights_bytes
        steps = [(-math.inf, inst.kv_bytes())]
        op = memory.running.get(inst.iid)
        if op is not None and op in self.op_end:
            steps.append((self.op_end[op], max(0.0, min(op.new, memory.target(inst.iid)) - weights)))
        elif grow is not None and memory.fits_now(inst.iid, weights + grow):
            steps.append((now + self.resize_seconds(inst, grow), grow))
        return steps

    # -- the nodes' iterations -----------------------------------------------------------------------------------

    def kick(self, node: Node, now: float) -> None:
        """Let the node pick its next iteration once everything else due at `now` has happened (an instance
        whose load completes at the same instant competes for the turn, as the shadow validation assumes)."""
        if node.running is None and not node.deciding:
            node.deciding = True
            self.at(now, DECIDE, node)

    def _decide(self, node: Node, now: float) -> None:
        if node.running is not None:
            return
        inst, stalled = node.next_turn(now)
        for s in stalled:
            self.policy.on_stall(self, s, now)
        if node.running is not None:  # a stall handler may have started one through kick
            return
        if inst is None:
            inst, _ = node.next_turn(now)
            if inst is None:
                return
        seconds, served = inst.load.next_iteration()
        if self.spec.noise:
            seconds *= 1.0 + float(self.rng.uniform(-self.spec.noise, self.spec.noise))
        node.running = (inst, served)
        node.busy_until = now + seconds
        node.busy_s += seconds
        self.at(now + seconds, TURN_DONE, node)

    def _turn_done(self, node: Node, now: float) -> None:
        assert node.running is not None
        inst, served = node.running
        node.running = None
        prefill = len(served) == 1 and served[0].output_tokens == 0
        finished = []
        for state in served:
            r = state
            assert isinstance(r, SimRequest)
            if r.instance is not inst:
                continue  # evicted while the iteration ran: its token is lost and recomputed elsewhere
            headroom = r.headroom(now)
            r.worst_headroom = min(r.worst_headroom, headroom)
            if headroom < -1e-9:
                r.late_tokens += 1
            if prefill:
                node.prefill_tokens += r.input_tokens
            else:
                node.decode_tokens += 1
            r.output_tokens += 1
            r.produced += 1
            if r.produced == 1:
                r.first_token = now
                r.served_on = node.kind
            if r.produced >= r.target_tokens:
                r.finish = now
                finished.append(r)
        for r in finished:
            self.detach(r, now)
        if finished:
            self.policy.on_instance_change(self, inst, now)
            self.policy.on_capacity_freed(self, now)
        self.kick(node, now)

    def _started(self, node: Node, ops: list[MemoryOp], now: float) -> None:
        for op in ops:
            self.op_end[op] = now + op.seconds
            inst = self.op_instance.get(op)
            if inst is not None and not inst.unloading and op.old == 0:
                inst.ready_at = now + op.seconds
            self.at(now + op.seconds, MEMORY_DONE, (node, op))

    def _memory_done(self, payload: tuple[Node, MemoryOp], now: float) -> None:
        node, op = payload
        started = node.memory.complete(op)
        self.op_end.pop(op, None)
        inst = self.op_instance.pop(op, None)
        if inst is not None and inst.unloading:
            if op.new == 0:
                node.instances.remove(inst)
                self._record_use(node, now)
        elif inst is not None:
            self.policy.on_instance_change(self, inst, now)
        self._started(node, started, now)
        if not op.grows:
            self.policy.on_capacity_freed(self, now)
        self.kick(node, now)

    def _keep_alive(self, inst: Instance, stamp: float, now: float) -> None:
        if inst.unloading or inst.load.requests or inst.queue or inst.idle_since != stamp:
            return
        if inst.ready_at >= now:  # still loading: recycle once it is up and still idle
            self.at(inst.ready_at + self.spec.keep_alive_s, KEEP_ALIVE, (inst, stamp))
            return
        self.unload(inst, now)
