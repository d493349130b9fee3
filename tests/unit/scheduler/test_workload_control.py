"""Workload-driven control: the controller measures traffic from a frontend's usage export and re-plans when the
measured lengths drift, with the real planner (CP-SAT over simulated latency tables), the declared catalog unchanged.

The export is a loopback HTTP stand-in with the frontend's path, bearer check and `since` filter
(tests/integration/test_workload_control_trace_roundtrip.py reads the real one)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from loopback_http import serve_app
from opentela._types import Lifecycle
from opentela.bench.traces import TraceRecord, write_trace
from opentela.cli.controller import FleetControllerNode, UsageFeed, admin_token
from opentela.cli.main import main
from opentela.errors import ConfigError
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.scheduler.fleet_catalog import parse_fleet_catalog

TOKEN = "admin-secret"
NOW = 1_800_000_000.0
RATE = 0.5
CATALOG: dict[str, Any] = {
    "models": [
        {
            "id": "Qwen/Qwen3-1.7B",
            "config": "Qwen3-1.7B",
            "engine": "vllm",
            # Declared: the same for the whole test; only the measured usage changes.
            "workload": {"rate": RATE, "input": 2000, "output": 200},
        }
    ],
    "planning": {
        "table_points": 6,
        "sim_duration_s": 10,
        "time_limit_s": 20,
        "usage_window_s": 600,
        "drift_min_samples": 30,
        "drift_cooldown_s": 300,
    },
}


def idle_node(peer: str) -> NodeRecord:
    """An idle worker with four RTX 3090s."""
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 3090"} for i in range(4)]
    return NodeRecord(f"s-{peer}", peer, "lab", Lifecycle.JOIN, 1, hardware={"gpus": gpus}, roles=("worker",))


def usage(end: float, input_tokens: int, n: int = 250) -> list[TraceRecord]:
    """`n` requests of the catalog model at RATE per second, the last at `end`, prompts around `input_tokens`."""
    return [
        TraceRecord(end - (n - 1 - i) / RATE, "Qwen/Qwen3-1.7B", input_tokens + 13 * (i % 5), 180 + i % 40)
        for i in range(n)
    ]


class Export:
    """The frontend's usage export, held in memory."""

    def __init__(self, tmp: Path) -> None:
        self.rows: list[TraceRecord] = []
        self.tmp = tmp

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": {"code": "admin_token_required"}}, status=401)
        since = float(request.query.get("since", "-inf"))
        path = self.tmp / "export.csv"
        write_trace([r for r in self.rows if r.timestamp >= since], path)
        return web.Response(body=path.read_bytes(), content_type="text/csv")


@pytest.fixture
async def export(tmp_path: Path) -> AsyncIterator[tuple[str, Export]]:
    held = Export(tmp_path)
    app = web.Application()
    app.router.add_get("/admin/usage/export.csv", held.handle)
    async with serve_app(app) as url:
        yield url, held


def controller_node(url: str) -> FleetControllerNode:
    catalog = parse_fleet_catalog(CATALOG)
    records = [idle_node("a"), idle_node("b")]
    agent: Any = SimpleNamespace(mesh=SimpleNamespace(live_records=lambda: records))
    feed = UsageFeed(url + "/v1", TOKEN, catalog.usage_window_s)
    return FleetControllerNode(agent, catalog, dry_run=True, usage=feed)


def replans(out: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, out.splitlines()) if e["event"] == "replan"]


async def test_long_measured_prompts_move_the_plan_to_wider_tensor_parallelism(
    export: tuple[str, Export], capsys: pytest.CaptureFixture[str]
) -> None:
    url, held = export
    node = controller_node(url)
    fleet = node.controller
    async with aiohttp.ClientSession() as http:
        # Short prompts measured: 300 tokens against the 2000 declared is drift; the plan takes two GPUs a replica.
        held.rows = usage(NOW, 300)
        first = await node.poll_usage(http, now=NOW)
        assert first is not None and node.wake.is_set()
        assert first.reasons["Qwen3-1.7B"] == ("median input 2000 -> 326 tokens (-84%)",)
        short = fleet.decide()
        assert fleet.last_plan is not None
        assert {g.tp for g in fleet.last_plan.groups} == {2}
        assert short and {(a.tp, len(a.gpus)) for a in short} == {(2, 2)}

        # 32K-token prompts at the same rate: within the cool-down the plan stays; after it, it widens to TP 4.
        held.rows = usage(NOW + 60, 32000)
        assert await node.poll_usage(http, now=NOW + 60) is None
        assert fleet.workloads()[0].input.median == pytest.approx(326)
        held.rows = usage(NOW + 400, 32000)
        second = await node.poll_usage(http, now=NOW + 400)
        assert second is not None
        assert second.reasons["Qwen3-1.7B"] == ("median input 326 -> 32026 tokens (+9724%)",)
        long = fleet.decide()
        assert {(g.tp, g.dp) for g in fleet.last_plan.groups} == {(4, 2)}
        assert sorted((a.peer_id, a.tp) for a in long) == [("a", 4), ("b", 4)]

    # Only the measured lengths moved the plan: the rate measured stayed the declared one.
    events = replans(capsys.readouterr().out)
    assert [round(e["workloads"]["Qwen3-1.7B"]["rate"], 3) for e in events] == [RATE, RATE]
    assert [e["workloads"]["Qwen3-1.7B"]["samples"] for e in events] == [250, 250]
    assert [list(e["reasons"]) for e in events] == [["Qwen3-1.7B"], ["Qwen3-1.7B"]]


class CountingNode(FleetControllerNode):
    """A dry-running controller node that says when it has sent its second and its fourth assignment."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = {2: asyncio.Event(), 4: asyncio.Event()}
        self.count = 0

    async def dry_run_send(self, peer_id: str, message: dict[str, Any]) -> dict[str, Any]:
        self.count += 1
        if self.count in self.sent:
            self.sent[self.count].set()
        return await super().dry_run_send(peer_id, message)


async def test_the_running_controller_replans_on_drift_and_assigns_the_next_idle_nodes(
    export: tuple[str, Export], capsys: pytest.CaptureFixture[str]
) -> None:
    url, held = export
    catalog = parse_fleet_catalog(
        {**CATALOG, "planning": {**CATALOG["planning"], "interval_s": 3600, "drift_cooldown_s": 0}}
    )
    records = [idle_node("a"), idle_node("b")]
    agent: Any = SimpleNamespace(mesh=SimpleNamespace(live_records=lambda: records))
    feed = UsageFeed(url, TOKEN, catalog.usage_window_s)
    node = CountingNode(agent, catalog, dry_run=True, usage=feed, usage_poll_s=0.2)

    async def table(request: web.Request) -> web.Response:
        return web.json_response([{"session_id": r.session_id, "lifecycle": "JOIN"} for r in records])

    app = web.Application()
    app.router.add_get("/v1/dnt/table", table)
    stop = asyncio.Event()
    held.rows = usage(time.time(), 300)
    async with serve_app(app) as ingress, aiohttp.ClientSession() as http, asyncio.timeout(90):
        running = asyncio.create_task(node.run(http, ingress, once=False, stop=stop))
        await node.sent[2].wait()
        # The first replicas now serve; two more idle nodes join, and the prompts grow to 32K tokens.
        records[:] = [
            dataclasses.replace(
                r, lifecycle=Lifecycle.SERVING, models=(ModelEntry("Qwen/Qwen3-1.7B", "vllm"),)
            )
            for r in records
        ] + [idle_node("c"), idle_node("d")]
        held.rows = usage(time.time(), 32000)
        await node.sent[4].wait()
        stop.set()
        await running
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in lines] == ["replan", "assign", "assign", "replan", "assign", "assign"]
    assert {(e["peer_id"], e["tp"]) for e in lines[1:3]} == {("a", 2), ("b", 2)}
    assert {(e["peer_id"], e["tp"]) for e in lines[4:]} == {("c", 4), ("d", 4)}


async def test_a_wrong_token_or_a_missing_token_file_is_an_error(
    export: tuple[str, Export], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = export
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ConfigError, match="answered 401"):
            await UsageFeed(url, "wrong", 60).measure(http, NOW)
    monkeypatch.delenv("OTELA_FRONTEND_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="needs the frontend's admin token"):
        admin_token(str(tmp_path / "missing"))
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert admin_token(str(tmp_path / "token")) == TOKEN
    monkeypatch.setenv("OTELA_FRONTEND_ADMIN_TOKEN", "from-env")
    assert admin_token(None) == "from-env"


def test_the_controller_checks_its_usage_flags_before_joining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    base = ["controller", "--key-file", str(tmp_path / "k"), "--catalog", str(catalog)]
    missing = str(tmp_path / "missing-token")
    assert main([*base, "--usage-from", "http://127.0.0.1:9", "--admin-token-file", missing]) == 2
    assert "needs the frontend's admin token" in capsys.readouterr().err
    (tmp_path / "token").write_text(TOKEN)
    token = ["--admin-token-file", str(tmp_path / "token")]
    assert main([*base, "--usage-from", "http://127.0.0.1:9", *token, "--usage-window", "0"]) == 2
    assert "--usage-window and --usage-poll must be positive" in capsys.readouterr().err
