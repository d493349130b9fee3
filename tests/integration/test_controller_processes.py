"""The fleet controller with real processes: an ingress, idle CPU workers with no engine, and `otela controller`
assigning a catalog model (the simulated engine's command template) over /otela/control/1."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess
from opentela.fabric.identity import Identity

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = [sys.executable, "-m", "opentela", "engine", "simulated", "--port", "{port}", "--model", "{model}"]


def write_catalog(path: Path) -> Path:
    catalog = {
        "models": [
            {
                "id": MODEL,
                "config": "SmolLM2-135M-Instruct",
                "command": TEMPLATE,
                "workload": {"rate": 1.0, "input": 64, "output": 16, "observe": False},
            }
        ],
        "planning": {"interval_s": 2, "table_points": 4, "sim_duration_s": 5, "time_limit_s": 20},
    }
    path.write_text(yaml.safe_dump(catalog))
    return path


def assign_lines(controller: NodeProcess) -> list[dict[str, Any]]:
    out = []
    for line in controller.log_text().splitlines():
        if line.startswith('{"event": "assign"'):
            out.append(json.loads(line))
    return out


async def records_by_provider(mesh: LocalMesh) -> dict[str, dict[str, Any]]:
    table = await mesh.get_json("/dnt/table") or []
    live = [r for r in table if r["lifecycle"] in ("JOIN", "SERVING")]
    return {r["provider_id"]: r for r in live}


async def run(*argv: str) -> str:
    """Run an `otela` command to completion; its stdout (stderr goes to the test's output on failure)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def chat(mesh: LocalMesh) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Otela-Provider", "")


@pytest.mark.timeout(300)
async def test_controller_assigns_idle_nodes_and_uses_new_ones(tmp_path: Path) -> None:
    key = tmp_path / "controller.key"
    controller_id = Identity.load_or_create(key).peer_id
    catalog = write_catalog(tmp_path / "catalog.yaml")
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("idle-a", None, "--controllers", controller_id)
        await mesh.add_worker("idle-b", None, "--controllers", controller_id)
        stranger = await mesh.add_worker("stranger", None)  # lists no controller: must refuse

        async def three_idle() -> dict[str, dict[str, Any]] | None:
            records = await records_by_provider(mesh)
            return records if {"idle-a", "idle-b", "stranger"} <= set(records) else None

        records = await mesh.wait_for(three_idle, timeout=60, what="three idle workers")
        argv = [
            *OTELA,
            "controller",
            "--ingress",
            mesh.api.removesuffix("/v1"),
            "--catalog",
            str(catalog),
            "--key-file",
            str(key),
            "--listen",
            "127.0.0.1:0",
        ]
        assert (await run(*argv, "--show-peer-id")).strip() == controller_id

        # A dry run decides and prints, and nodes stay idle.
        planned = [json.loads(line) for line in (await run(*argv, "--once", "--dry-run")).splitlines()]
        assert planned and all(line["dry_run"] and line["model"] == MODEL for line in planned)
        assert {line["peer_id"] for line in planned} <= {r["peer_id"] for r in records.values()}
        records = await records_by_provider(mesh)
        assert all(records[p]["lifecycle"] == "JOIN" for p in ("idle-a", "idle-b", "stranger"))

        controller = NodeProcess("controller", argv, mesh.logs / "controller.log")
        mesh.nodes["controller"] = controller
        await controller.start()

        await mesh.wait_serving(MODEL, 2, timeout=120)
        status, provider = await chat(mesh)
        assert status == 200 and provider in ("idle-a", "idle-b")

        records = await records_by_provider(mesh)
        stranger_id = records["stranger"]["peer_id"]

        async def refused() -> bool:
            return any(
                line["peer_id"] == stranger_id and line.get("code") == "not_authorised"
                for line in assign_lines(controller)
            )

        await mesh.wait_for(refused, timeout=60, what="the stranger to refuse the controller")
        assert records["stranger"]["lifecycle"] == "JOIN" and not records["stranger"]["models"]
        assert "assignment refused" in stranger.log_text() and "not_authorised" in stranger.log_text()
        serving = {p: records[p]["session_id"] for p in ("idle-a", "idle-b")}
        assert all(records[p]["lifecycle"] == "SERVING" for p in serving)

        # A worker that joins later is used by the next round; the serving ones are left alone.
        await mesh.add_worker("late", None, "--controllers", controller_id)
        await mesh.wait_serving(MODEL, 3, timeout=90)
        records = await records_by_provider(mesh)
        assert {p: records[p]["session_id"] for p in serving} == serving
        assert records["stranger"]["lifecycle"] == "JOIN"

        lines = assign_lines(controller)
        accepted = [line["peer_id"] for line in lines if line["ok"]]
        expected = {records[p]["peer_id"] for p in ("idle-a", "idle-b", "late")}
        assert sorted(accepted) == sorted(expected)  # each idle node once, never a serving node again
        assert all(line["model"] == "SmolLM2-135M-Instruct" and line["gpus"] == [] for line in lines)
        statuses = await asyncio.gather(*(chat(mesh) for _ in range(6)))
        assert all(s == 200 for s, _ in statuses)
        assert controller.exited() is None, controller.log_tail()
        status = await run(*OTELA, "status", "--ingress", mesh.api.removesuffix("/v1"))
        assert "controller" in status and status.count("SmolLM2-135M-Instruct") >= 3
