"""Placement behaviour of LLM-Mesh and of the ServerlessLLM baselines in the simulator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from opentela.engines.headroom import Slo
from opentela.scheduler.llm_mesh.cluster import ClusterSpec, MeshSimulator, ServingPolicy
from opentela.scheduler.llm_mesh.mesh_policy import LlmMeshPolicy
from opentela.scheduler.llm_mesh.node import SimRequest
from opentela.scheduler.llm_mesh.policies import make_policy
from opentela.scheduler.llm_mesh.profiles import MODELS
from opentela.scheduler.llm_mesh.sllm_policy import SllmPolicy
from opentela.scheduler.workload import Trace


def trace(rows: list[tuple[float, int, int, int]]) -> Trace:
    arrival, inp, out, model = (np.array(c) for c in zip(*rows, strict=True))
    return Trace(arrival.astype(float), inp.astype(np.int64), out.astype(np.int64), model.astype(np.int64))


def simulator(rows: list[tuple[float, int, int, int]], size: str, policy: ServingPolicy, cpu: int = 1,
              gpu: int = 1) -> MeshSimulator:  # fmt: skip
    models = [MODELS[size]] * (max(r[3] for r in rows) + 1)
    spec = ClusterSpec(cpu_nodes=cpu, gpu_nodes=gpu)
    return MeshSimulator(spec, models, trace(rows), policy, 211.0, np.random.default_rng(0))


def decoding(rid: int, now: float, model: int = 0) -> SimRequest:
    r = SimRequest(start=now, slo=Slo(2.0, 0.25), input_tokens=100, output_tokens=1, rid=rid, model=model)
    r.target_tokens, r.produced = 500, 1
    return r


def test_llm_mesh_serves_on_cpu_when_the_cpu_validates() -> None:
    sim = simulator([(0.0, 500, 20, 0)], "3B", LlmMeshPolicy())
    out = sim.run(window_s=10.0)
    assert out.requests[0].served_on == "cpu" and out.slo_compliant().all()
    assert out.nodes_used("gpu") == 0 < out.nodes_used("cpu")


def test_llm_mesh_goes_to_the_gpu_when_the_cpu_would_miss_the_ttft() -> None:
    # 13B, 2048 tokens: a CPU cold start (1.5 s) plus its prefill (2.6 s, +10 %) passes the 4 s TTFT SLO.
    sim = simulator([(0.0, 2048, 20, 0)], "13B", LlmMeshPolicy())
    out = sim.run()
    assert out.requests[0].served_on == "gpu" and out.slo_compliant().all()


def test_without_cpu_nodes_llm_mesh_uses_the_gpu() -> None:
    out = simulator([(0.0, 500, 20, 0)], "3B", LlmMeshPolicy(), cpu=0).run()
    assert out.requests[0].served_on == "gpu"


def a_small_and_a_large_instance(policy: LlmMeshPolicy) -> tuple[Any, Any, Any, SimRequest]:
    """Two CPU nodes with one instance each, batches of 1 and 3, and a new request to place."""
    sim = simulator([(0.0, 100, 10, 0)], "3B", policy, cpu=2, gpu=0)
    small = sim.create_instance(sim.nodes[0], 0, 8e9, 0.0)
    large = sim.create_instance(sim.nodes[1], 0, 8e9, 0.0)
    assert small is not None and large is not None
    sim.settle_memory(5.0)
    sim.attach(decoding(100, 5.0), small, 5.0)
    for rid in (101, 102, 103):
        sim.attach(decoding(rid, 5.0), large, 5.0)
    new = SimRequest(start=5.0, slo=Slo(2.0, 0.25), input_tokens=200, rid=0, model=0, target_tokens=10)
    return sim, small, large, new


def test_bin_packing_picks_the_instance_with_the_highest_batch() -> None:
    policy = LlmMeshPolicy()
    sim, _small, large, new = a_small_and_a_large_instance(policy)
    assert policy.place(sim, new, 5.0)
    assert new.instance is large


def test_spreading_instead_picks_the_smallest_batch() -> None:
    policy = LlmMeshPolicy(bin_packing=False)
    sim, small, _large, new = a_small_and_a_large_instance(policy)
    assert policy.place(sim, new, 5.0) and new.instance is small


@pytest.mark.parametrize("policy", ["llm-mesh", "sllm", "sllm+cpu"])
def test_a_cold_start_delays_the_first_token_by_the_load_time(policy: str) -> None:
    sim = simulator([(1.0, 500, 5, 0)], "7B", make_policy(policy, {0: "7B"}), cpu=0)
    out = sim.run()
    node = sim.nodes[0]
    profile = sim.profile(0, node)
    expected = sim.load_seconds(0, node) + profile.prefill_time(500)
    assert out.requests[0].first_token - 1.0 == pytest.approx(expected)


def test_keep_alive_recycles_an_idle_instance() -> None:
    sim = simulator([(0.0, 500, 5, 0), (30.0, 500, 5, 0)], "3B", LlmMeshPolicy(), gpu=0)
    out = sim.run(window_s=40.0)
    first = out.requests[0]
    spec = sim.spec
    # in use from the arrival until keep-alive after the finish, plus the unload; twice (the second is cold again)
    busy = first.finish + spec.keep_alive_s + spec.cold_start.unload_s
    assert out.nodes_used("cpu") * 40.0 == pytest.approx(2 * busy, rel=1e-6)
    assert not sim.nodes[0].instances
    assert out.requests[1].first_token - 30.0 == pytest.approx(first.first_token)


def test_sllm_scales_out_at_its_concurrency_threshold() -> None:
    policy = SllmPolicy({0: "13B"})
    rows = [(0.0, 100, 100, 0)] * 17
    sim = simulator(rows, "13B", policy, cpu=0, gpu=4)
    for r in sim.requests[:16]:
        policy.dispatch(sim, r, 0.0)
    assert len(sim.instances_of(0)) == 1  # 16 in flight: at the threshold, not past it
    policy.dispatch(sim, sim.requests[16], 0.0)
    assert len(sim.instances_of(0)) == 2


def test_sllm_keeps_to_gpus_and_sllm_cpu_starts_on_cpu() -> None:
    rows = [(0.0, 300, 5, 0)]
    assert simulator(rows, "3B", make_policy("sllm", {0: "3B"})).run().requests[0].served_on == "gpu"
    assert simulator(rows, "3B", make_policy("sllm+cpu", {0: "3B"})).run().requests[0].served_on == "cpu"


def test_sllm_cpu_scales_out_at_the_cpu_threshold() -> None:
    policy = SllmPolicy({0: "7B"}, use_cpu=True)
    sim = simulator([(0.0, 100, 100, 0)] * 16, "7B", policy, cpu=2, gpu=0)
    for r in sim.requests:
        policy.dispatch(sim, r, 0.0)
    assert sorted(i.inflight for i in sim.instances_of(0)) == [1, 15]


def test_a_model_waits_for_a_free_node_under_sllm() -> None:
    policy = SllmPolicy({0: "3B", 1: "3B"})
    out = simulator([(0.0, 300, 50, 0), (0.1, 300, 5, 1)], "3B", policy, cpu=0, gpu=1).run()
    first, second = out.requests
    assert second.first_token > first.finish  # the only GPU is taken until the first model is recycled
