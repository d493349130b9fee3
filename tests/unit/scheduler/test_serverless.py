"""The serverless controller's decisions: where an instance goes, what it takes, how wants are answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from opentela._types import Lifecycle, PeerId, SessionId
from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.scheduler.fleet_catalog import load_fleet_catalog
from opentela.scheduler.serverless import (
    ServerlessController,
    ServerlessModel,
    choose_node,
    instance_memory_mib,
    room_mib,
)


def node(name: str, lent: int, models: dict[str, int | None] | None = None, gpu: bool = False) -> NodeRecord:
    entries = tuple(
        ModelEntry(m, "simulated", {} if mib is None else {"memory_mib": mib})
        for m, mib in (models or {}).items()
    )
    return NodeRecord(
        session_id=SessionId(f"s-{name}"),
        peer_id=PeerId(f"p-{name}"),
        provider_id=name,
        lifecycle=Lifecycle.SERVING if entries else Lifecycle.JOIN,
        version=1,
        roles=("worker",),
        hardware={"engine_memory_mib": lent, "gpus": [{"memory_mib": lent}] if gpu else []},
        models=entries,
    )


def test_room_counts_the_footprints_and_an_exclusive_engine_leaves_none() -> None:
    assert room_mib(node("a", 1000)) == 1000
    assert room_mib(node("a", 1000, {"x": 300, "y": 200})) == 500
    assert room_mib(node("a", 1000, {"x": None})) is None  # started without a footprint: the node is its own
    assert room_mib(node("a", 0)) is None


def test_cpu_first_then_the_best_fit() -> None:
    cpu_big, cpu_tight, gpu = (
        node("cpu-big", 8000),
        node("cpu-tight", 1000, {"x": 300}),
        node("gpu", 80000, gpu=True),
    )
    records = [gpu, cpu_big, cpu_tight]
    assert choose_node(records, 600, {}).provider_id == "cpu-tight"  # 100 left beats 7400 left
    assert choose_node(records, 800, {}).provider_id == "cpu-big"
    assert choose_node(records, 9000, {}).provider_id == "gpu"  # no CPU node has room
    assert choose_node(records, 600, {"p-cpu-tight": 200}).provider_id == "cpu-big"  # an instance on its way
    assert choose_node(records, 600, {}, exclude=["p-cpu-tight", "p-cpu-big"]).provider_id == "gpu"
    assert choose_node(records, 100_000, {}) is None


def test_instance_memory_follows_eq_2() -> None:
    # 1 GiB of weights, 1 KiB per token: L_min dominates short requests, long ones take what they need.
    assert instance_memory_mib(2**30, 1024, 100, 50, 4096) == 1024 + 4
    assert instance_memory_mib(2**30, 1024, 6000, 2000, 4096) == 1024 + 8


async def test_wants_start_one_instance_and_time_its_cold_start() -> None:
    clock = [100.0]
    records = [node("a", 1000), node("b", 4000)]
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(peer: str, message: dict[str, Any]) -> dict[str, Any]:
        sent.append((peer, message))
        return {"ok": peer != "p-a"}  # a refuses (another controller was quicker)

    spec = ServerlessModel("m", {"command": "serve {model} --port {port}"}, 600, 2.0)
    ctl = ServerlessController({"m": spec}, lambda: records, send, clock=lambda: clock[0])
    assert (await ctl.want("other"))["code"] == "unknown_model"
    first = await ctl.want("m")
    assert first["ok"] and first["state"] == "starting" and first["node"] == "p-b"
    assert [p for p, _ in sent] == ["p-a", "p-b"]
    assert sent[-1][1] == {
        "op": "assign",
        "model": "m",
        "command": "serve {model} --port {port}",
        "memory_mib": 600,
        "keep_alive_s": 2.0,
    }
    clock[0] += 1.5
    again = await ctl.want("m")
    assert again["state"] == "starting" and again["waited_s"] == 1.5 and len(sent) == 2  # no second start
    records[1] = node("b", 4000, {"m": 600})
    clock[0] += 0.5
    assert (await ctl.want("m"))["state"] == "warm"
    assert ctl.cold_starts["m"] == [2.0] and ctl.state()["m"]["state"] == "warm"


async def test_a_failed_start_is_retried_elsewhere_and_no_room_is_said() -> None:
    records = [node("a", 1000)]

    async def send(peer: str, message: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    ctl = ServerlessController({"m": ServerlessModel("m", {}, 600, 2.0)}, lambda: records, send)
    assert (await ctl.want("m"))["node"] == "p-a"
    records[0] = NodeRecord(**{**records[0].__dict__, "version": 2, "reason": "assignment failed: exit 7"})
    ctl.settle()
    assert "m" not in ctl.starting
    big = ServerlessController({"m": ServerlessModel("m", {}, 5000, 2.0)}, lambda: records, send)
    answer = await big.want("m")
    assert (answer["ok"], answer["code"]) == (False, "no_room") and "5000 MiB" in answer["error"]


def test_the_catalog_marks_serverless_models(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "id": "kept",
                        "config": "SmolLM2-135M-Instruct",
                        "engine": "embedded",
                        "workload": {"rate": 1},
                    },
                    {
                        "id": "lazy",
                        "config": "SmolLM2-135M-Instruct",
                        "engine": "embedded",
                        "serverless": {"keep_alive_s": 30},
                    },
                    {
                        "id": "lazy2",
                        "config": "SmolLM2-135M-Instruct",
                        "engine": "embedded",
                        "serverless": True,
                    },
                ]
            }
        )
    )
    catalog = load_fleet_catalog(path)
    assert [m.id for m in catalog.kept] == ["kept"] and sorted(catalog.serverless) == ["lazy", "lazy2"]
    lazy = catalog.serverless["lazy"]
    assert lazy.keep_alive_s == 30 and catalog.serverless["lazy2"].keep_alive_s == 60
    # Eq. 2 from SmolLM2's shape: ~258 MiB of fp16 weights plus the KV cache of its 8192-token context.
    assert 400 < lazy.memory_mib < 600
    assert len(catalog.controller_config().workloads) == 1
    assert lazy.profile == ""
    path.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "id": "x",
                        "engine": "embedded",
                        "config": "SmolLM2-135M-Instruct",
                        "serverless": {"ttl": 1},
                    }
                ]
            }
        )
    )
    with pytest.raises(ConfigError, match="unknown fields"):
        load_fleet_catalog(path)


async def test_a_catalog_profile_goes_out_with_the_assignment(tmp_path: Path) -> None:
    lengths = (64, 128)
    prof = PerformanceProfile("x", "t", "cpu", lengths, (0.01, 0.02), (1, 2), lengths, ((0.01,) * 2,) * 2)
    prof.save(tmp_path / "x.json")
    path = tmp_path / "catalog.yaml"
    model = {
        "id": "x",
        "config": "SmolLM2-135M-Instruct",
        "engine": "embedded",
        "serverless": {"profile": "x.json"},
    }
    path.write_text(yaml.safe_dump({"models": [model]}))
    spec = load_fleet_catalog(path).serverless["x"]
    assert spec.profile == prof.profile_id
    sent: list[dict[str, Any]] = []

    async def send(peer: str, message: dict[str, Any]) -> dict[str, Any]:
        sent.append(message)
        return {"ok": True}

    await ServerlessController({"x": spec}, lambda: [node("a", 4000)], send).want("x")
    assert sent[0]["profile"] == prof.profile_id
