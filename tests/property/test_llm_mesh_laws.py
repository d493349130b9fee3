"""Laws of the LLM-Mesh simulation: validated requests are never late under an exact profile, and the memory
orchestrator never holds more than the node has, whatever order its operations come and complete in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.scheduler.llm_mesh.cluster import ClusterSpec, MeshSimulator
from opentela.scheduler.llm_mesh.mesh_policy import LlmMeshPolicy
from opentela.scheduler.llm_mesh.orchestrator import MemoryOp, MemoryOrchestrator
from opentela.scheduler.llm_mesh.profiles import MODELS
from opentela.scheduler.workload import Trace

requests = st.lists(
    st.tuples(
        st.floats(0, 15, allow_nan=False),
        st.integers(16, 3000),
        st.integers(1, 400),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(requests, st.sampled_from(["3B", "7B", "13B"]), st.integers(0, 1), st.integers(0, 1))
def test_no_validated_request_is_ever_late_under_an_exact_profile(
    rows: list[tuple[float, int, int, int]], size: str, cpu: int, gpu: int
) -> None:
    rows = sorted(rows)
    arrival, inp, out, model = (np.array(c) for c in zip(*rows, strict=True))
    trace = Trace(arrival.astype(float), inp.astype(np.int64), out.astype(np.int64), model.astype(np.int64))
    spec = ClusterSpec(cpu_nodes=cpu, gpu_nodes=max(gpu, 1 - cpu), noise=0.0)
    sim = MeshSimulator(spec, [MODELS[size]] * 4, trace, LlmMeshPolicy(), 211.0, np.random.default_rng(0))
    result = sim.run()
    for r in result.requests:
        if r.validated:
            assert r.late_tokens == 0, (r.rid, r.worst_headroom)
    # A validated request that was never moved off its instance (evicted or preempted) also finishes.
    assert all(np.isfinite(r.finish) for r in result.requests if r.validated and not r.migrations)


operations = st.lists(
    st.tuples(st.sampled_from(["submit", "complete"]), st.integers(0, 4), st.floats(0, 60, allow_nan=False)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_memory_orchestration_never_exceeds_node_memory(ops: list[tuple[str, int, float]]) -> None:
    capacity = 100.0
    mem = MemoryOrchestrator(capacity, lambda old, new: abs(new - old) / 10)
    # What the node physically holds, kept apart from the orchestrator's own books: a growth allocates its new
    # size when it starts, a shrink (or unload) frees memory only when it completes.
    physical: dict[int, float] = {}
    running: list[MemoryOp] = []

    def started(ops_started: list[MemoryOp]) -> None:
        for op in ops_started:
            physical[op.slot] = max(physical.get(op.slot, 0.0), op.new)
        running.extend(ops_started)

    def complete(op: MemoryOp) -> None:
        now_started = mem.complete(op)
        physical[op.slot] = op.new
        started(now_started)

    for kind, slot, size in ops:
        if kind == "submit":
            new = 0.0 if size < 5 else size  # sizes under 5 are unloads
            op, now_started = mem.submit(slot, new)
            if op is None:
                assert mem.budget - mem.target(slot) + new > capacity
            started(now_started)
        elif running:
            complete(running.pop(slot % len(running)))
        assert sum(physical.values()) <= capacity + 1e-6
        assert mem.budget <= capacity + 1e-6
    # Liveness: once everything in flight completes, the station drains and every slot reaches its target.
    while running:
        complete(running.pop(0))
        assert sum(physical.values()) <= capacity + 1e-6
    assert not mem.station
    assert all(abs(physical.get(s, 0.0) - t) < 1e-9 for s, t in mem.targets.items())
