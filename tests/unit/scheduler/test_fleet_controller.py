"""The fleet controller's rounds: pending models onto idle nodes, in-flight nodes left alone, failures retried.

The network is an in-memory callable recording what would go over /otela/control/1."""

from __future__ import annotations

import time
from typing import Any

from opentela._types import Lifecycle
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.scheduler.controller import ControllerConfig, FleetController
from opentela.scheduler.tables import SimSettings
from opentela.scheduler.workload import LengthDist, Workload

FAST = SimSettings(horizon_s=10.0, min_requests=60, max_requests=300, rate_points=6)
WORKLOADS = (
    Workload("Qwen3-1.7B", 20.0, LengthDist(300, 50), LengthDist(100, 20)),
    Workload("Llama-3.1-8B-Instruct", 5.0, LengthDist(600, 100), LengthDist(200, 40)),
)


def node(
    peer: str, gpus: int, models: tuple[str, ...] = (), lifecycle: Lifecycle = Lifecycle.SERVING
) -> NodeRecord:
    hardware = {"gpus": [{"index": i, "name": "NVIDIA L40S"} for i in range(gpus)]}
    served = tuple(ModelEntry(m, "vllm") for m in models)
    return NodeRecord(f"s-{peer}", peer, "lab", lifecycle, 1, hardware=hardware, models=served)


class Mesh:
    """Registry records and a control channel held in memory."""

    def __init__(self, records: list[NodeRecord], refuse: set[str] = frozenset()) -> None:
        self.records, self.refuse, self.sent = records, refuse, []

    async def send(self, peer: str, message: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((peer, message))
        return {"ok": False, "error": "busy"} if peer in self.refuse else {"ok": True}


def controller(mesh: Mesh, **settings: Any) -> FleetController:
    config = ControllerConfig(WORKLOADS, engine="vllm", settings=FAST, time_limit_s=20.0, **settings)
    return FleetController(config, lambda: mesh.records, mesh.send)


async def test_pending_models_go_to_idle_nodes_once() -> None:
    mesh = Mesh(
        [
            node("busy", 2, models=("Qwen3-1.7B",)),
            node("a", 2),
            node("b", 1),
            node("gone", 4, lifecycle=Lifecycle.DOWN),
        ]
    )
    fleet = controller(mesh, scale_out=False)
    results = await fleet.run_round()
    assert results and all(answer["ok"] for _, answer in results)
    assert {m["model"] for _, m in mesh.sent} == {"Llama-3.1-8B-Instruct"}  # Qwen is served already
    assert {p for p, _ in mesh.sent} <= {"a", "b"}
    for _, message in mesh.sent:
        assert (
            message["op"] == "assign"
            and message["engine"] == "vllm"
            and len(message["gpus"]) == message["tp"]
        )
    before = len(mesh.sent)
    await fleet.run_round()  # the nodes are still loading: nobody is told twice
    assert len(mesh.sent) == before
    # A node that never comes up is given up on after assign_timeout_s: its model is pending again.
    later = time.monotonic() + fleet.config.assign_timeout_s + 1
    assert {a.model for a in fleet.decide(now=later)} == {"Llama-3.1-8B-Instruct"}


async def test_nothing_pending_means_no_plan() -> None:
    mesh = Mesh([node("a", 1, models=("Qwen3-1.7B", "Llama-3.1-8B-Instruct")), node("b", 2)])
    assert await controller(mesh, scale_out=False).run_round() == [] and mesh.sent == []


async def test_idle_nodes_add_replicas_but_serving_nodes_are_never_touched() -> None:
    mesh = Mesh([node("a", 1, models=("Qwen3-1.7B", "Llama-3.1-8B-Instruct")), node("b", 2)])
    fleet = controller(mesh)
    await fleet.run_round()
    assert mesh.sent and {p for p, _ in mesh.sent} == {"b"}
    assert {m["model"] for _, m in mesh.sent} <= {w.model for w in WORKLOADS}


async def test_an_unauthorised_node_is_left_out_for_a_while() -> None:
    mesh = Mesh([node("a", 2)])

    async def refuse(peer: str, message: dict[str, Any]) -> dict[str, Any]:
        mesh.sent.append((peer, message))
        return {"ok": False, "code": "not_authorised", "error": "not listed"}

    fleet = FleetController(
        ControllerConfig(WORKLOADS, settings=FAST, time_limit_s=20.0), lambda: mesh.records, refuse
    )
    await fleet.run_round()
    await fleet.run_round()
    assert [p for p, _ in mesh.sent].count("a") == 1
    later = time.monotonic() + fleet.config.refused_backoff_s + 1
    assert fleet.decide(now=later)


async def test_fewer_devices_than_models_serves_the_most_requested() -> None:
    mesh = Mesh([node("a", 1)])
    await controller(mesh).run_round()
    assert [m["model"] for _, m in mesh.sent] == ["Qwen3-1.7B"]  # 20 req/s against 5


async def test_messages_carry_the_served_id_and_the_launch_template() -> None:
    mesh = Mesh([node("a", 1)])
    launch = {"Qwen3-1.7B": {"command": "vllm serve {model} --port {port}"}}
    fleet = controller(mesh, served_as={"Qwen3-1.7B": "org/qwen-ft"}, launch=launch)
    await fleet.run_round()
    (_, message), *_ = mesh.sent
    assert message["model"] == "org/qwen-ft" and message["command"] == "vllm serve {model} --port {port}"


async def test_a_refusing_node_is_offered_work_again_next_round() -> None:
    mesh = Mesh([node("a", 2)], refuse={"a"})
    fleet = controller(mesh)
    await fleet.run_round()
    await fleet.run_round()
    assert [p for p, _ in mesh.sent].count("a") >= 2


async def test_observed_rates_replace_the_declared_ones() -> None:
    fleet = controller(Mesh([]))
    fleet.observed_rates = {"Qwen3-1.7B": 0.25}
    rates = {w.model: w.rate for w in fleet.workloads()}
    assert rates == {"Qwen3-1.7B": 0.25, "Llama-3.1-8B-Instruct": 5.0}


async def test_a_drifted_workload_changes_what_the_next_idle_node_gets() -> None:
    mesh = Mesh([node("a", 1)])
    fleet = controller(mesh)
    fleet.observed_rates = {"Qwen3-1.7B": 0.5, "Llama-3.1-8B-Instruct": 30.0}
    await fleet.run_round()
    assert [m["model"] for _, m in mesh.sent] == ["Llama-3.1-8B-Instruct"]
