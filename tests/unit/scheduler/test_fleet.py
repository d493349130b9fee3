"""The fleet controller's decision: idle nodes from registry records, plans over them, packing onto nodes."""

from __future__ import annotations

import dataclasses

import pytest

from opentela._types import Lifecycle
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.scheduler.fleet import assign, cluster_of, device_type, idle_nodes
from opentela.scheduler.placement import Group, Plan, Problem, check_plan, get_policy
from opentela.scheduler.tables import SimSettings, TableBuilder
from opentela.scheduler.workload import LengthDist, Workload


def record(
    peer: str, gpus: list[str], lifecycle: Lifecycle = Lifecycle.SERVING, models: tuple = ()
) -> NodeRecord:
    hardware = {"gpus": [{"index": i, "name": name, "memory_mib": 81920} for i, name in enumerate(gpus)]}
    return NodeRecord(f"s-{peer}", peer, "lab", lifecycle, 1, hardware=hardware, models=models)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80G"),
        ("NVIDIA A100-SXM4-40GB", "A100-40G"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA A10G", "A10G"),
        ("Matrox G200", None),
    ],
)
def test_gpu_names_map_to_catalog_entries(name: str, kind: str | None) -> None:
    assert device_type(name) == kind


def test_only_up_nodes_without_models_are_idle() -> None:
    records = [
        record("a", ["NVIDIA A100-SXM4-80GB"] * 4),
        record("b", ["NVIDIA GH200 480GB"] * 4, models=(ModelEntry("m", "vllm"),)),
        record("c", ["NVIDIA GH200 480GB"] * 4, lifecycle=Lifecycle.DOWN),
        record("d", ["NVIDIA GH200 480GB"] * 2, lifecycle=Lifecycle.JOIN),
        record("e", []),
    ]
    nodes = idle_nodes(records)
    assert [(n.peer_id, n.device, n.gpus) for n in nodes] == [
        ("a", "A100-80G", (0, 1, 2, 3)),
        ("d", "GH200", (0, 1)),
    ]
    cluster = cluster_of(nodes)
    assert cluster.devices == {"A100-80G": 4, "GH200": 2}
    assert cluster.catalog["GH200"].devices_per_node == 2  # TP cannot exceed the widest idle node


def test_plans_over_idle_nodes_pack_onto_whole_nodes() -> None:
    records = [record(f"a{i}", ["NVIDIA A100-SXM4-80GB"] * 2) for i in range(3)]
    records += [record("l0", ["NVIDIA L40S"] * 4)]
    nodes = idle_nodes(records)
    workloads = [
        Workload("Llama-3.1-8B", 10.0, LengthDist(800, 100), LengthDist(200, 50)),
        Workload("Qwen3-1.7B", 30.0, LengthDist(300, 50), LengthDist(100, 20)),
    ]
    settings = SimSettings(horizon_s=10.0, min_requests=60, max_requests=300, rate_points=8)
    problem = Problem(cluster_of(nodes), workloads, TableBuilder(settings=settings), shares=5)
    plan = get_policy("cpsat").place(problem)
    assert check_plan(problem, plan) == []
    assignments, missing = assign(plan, nodes)
    assert not missing
    assert len(assignments) == sum(g.dp for g in plan.groups)
    used = [(a.peer_id, gpu) for a in assignments for gpu in a.gpus]
    assert len(used) == len(set(used))  # no GPU twice
    assert all(len(a.gpus) == a.tp for a in assignments)


def test_replicas_wider_than_the_free_part_of_any_node_are_reported() -> None:
    nodes = idle_nodes(
        [record("a", ["NVIDIA H100 80GB HBM3"] * 3), record("b", ["NVIDIA H100 80GB HBM3"] * 3)]
    )
    plan = Plan("hand", [Group("Llama-3.3-70B-Instruct", "H100-SXM", 2, 3, 1.0)])
    assignments, missing = assign(plan, nodes)
    assert len(assignments) == 2 and missing == [("Llama-3.3-70B-Instruct", "H100-SXM", 2)]


def test_one_replica_per_node_when_nodes_run_one_engine() -> None:
    nodes = idle_nodes([record("a", ["NVIDIA L40S"] * 4), record("b", ["NVIDIA L40S"] * 2)])
    plan = Plan("hand", [Group("Qwen3-1.7B", "L40S", 1, 3, 1.0)])
    assignments, missing = assign(plan, nodes, one_per_node=True)
    assert sorted(a.peer_id for a in assignments) == ["a", "b"]
    assert missing == [("Qwen3-1.7B", "L40S", 1)]


def test_cpu_only_workers_are_one_cpu_device_and_other_roles_never_idle() -> None:
    cpu = {"model": "Some CPU", "flags": ["avx2", "fma"], "threads": 8, "usable": 4, "cores": 4}
    records = [
        record("w", []),
        record("ingress", []),
        record("gpu", ["NVIDIA L40S"]),
    ]
    records = [
        dataclasses.replace(
            r,
            hardware={**r.hardware, "cpu": cpu, "ram_mib": 16384},
            roles=("ingress",) if r.peer_id == "ingress" else ("worker",),
        )
        for r in records
    ]
    loading = dataclasses.replace(records[0], peer_id="loading", reason="starting m for controller X")
    nodes = idle_nodes([*records, loading])
    by_peer = {n.peer_id: n for n in nodes}
    assert set(by_peer) == {"w", "gpu"}
    node = by_peer["w"]
    assert node.device == "CPU-4T-avx2" and node.gpus == () and node.devices == 1
    assert node.entry is not None and node.entry.kind == "cpu" and node.entry.memory_gib == 16
    cluster = cluster_of([node])
    assert cluster.devices == {"CPU-4T-avx2": 1}
    plan = Plan("hand", [Group("SmolLM2-135M-Instruct", "CPU-4T-avx2", 1, 1, 1.0)])
    assignments, missing = assign(plan, [node], one_per_node=True)
    assert not missing and assignments[0].gpus == () and assignments[0].peer_id == "w"
