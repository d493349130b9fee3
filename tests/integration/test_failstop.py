"""Fail-stop with real processes: a hung engine and an NCCL timeout in the engine log take the node DOWN,
its log tail reaches the sink (a file, an HTTP server), it exits with the documented code, traffic moves on."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loopback_http import serve_app
from opentela.cli.localmesh import OTELA, LocalMesh, free_port
from opentela.node.engine_runner import EXIT_ENGINE_DIED, EXIT_ENGINE_UNHEALTHY, EXIT_FATAL_LOG_LINE

pytestmark = pytest.mark.integration

MODEL = "sim-model"
SIMULATED = [*OTELA, "engine", "simulated", "--model", MODEL]
NCCL_LINE = "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] NCCL watchdog: ALLREDUCE timed out after 600000 ms"


async def chat(mesh: LocalMesh, timeout: float = 30.0) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with asyncio.timeout(timeout):
        async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
            await resp.read()
            return resp.status, resp.headers.get("X-Otela-Provider", "")


async def record_state(mesh: LocalMesh, provider: str) -> dict[str, Any] | None:
    table = await mesh.get_json("/dnt/table") or []
    return next((r for r in table if r["provider_id"] == provider), None)


async def wait_state(
    mesh: LocalMesh, provider: str, states: tuple[str, ...], timeout: float
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        record = await record_state(mesh, provider)
        return record if record and record["lifecycle"] in states else None

    return await mesh.wait_for(probe, timeout=timeout, what=f"{provider} to be {'/'.join(states)}")


@pytest.fixture
async def sink_server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP log sink on loopback collecting what nodes POST."""
    received: list[dict[str, Any]] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/sink", collect)
    async with serve_app(app) as url:
        yield f"{url}/sink", received


async def test_hung_engine_fail_stops_after_the_unhealthy_limit(tmp_path: Path) -> None:
    sink = tmp_path / "sink" / "failures.log"
    config = tmp_path / "node.toml"
    config.write_text("[node]\nhealth_timeout = 0.3\n")
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        worker = await mesh.add_worker(
            "hung",
            [*SIMULATED, "--hang-after", "0"],
            "--config",
            str(config),
            "--health-interval",
            "0.2",
            "--health-failures",
            "0",  # only the time limit decides here
            "--unhealthy-limit",
            "2",
            "--log-sink",
            str(sink),
            provider="lab-hung",
        )
        await mesh.wait_serving(MODEL, 1, timeout=60)
        serving = await wait_state(mesh, "lab-hung", ("SERVING",), timeout=10)
        # The first request hangs the engine, health checks included; its own fate does not matter here.
        hung_request = asyncio.create_task(chat(mesh, timeout=60))
        down = await wait_state(mesh, "lab-hung", ("DOWN",), timeout=30)
        assert await worker.wait(timeout=30) == EXIT_ENGINE_UNHEALTHY
        hung_request.cancel()
        await asyncio.gather(hung_request, return_exceptions=True)

    assert down["session_id"] == serving["session_id"]
    assert "unhealthy for" in down["reason"] and "limit 2 s" in down["reason"]
    report = sink.read_text()
    header = report.splitlines()[0]
    assert header.startswith("===== otela fail-stop ")
    assert f"session={serving['session_id']}" in header and "provider=lab-hung" in header
    assert f"exit={EXIT_ENGINE_UNHEALTHY}" in header
    assert "reason: engine unhealthy for" in report
    assert "SIMULATED engine, model sim-model" in report  # the engine's own log line
    assert "engine health check failed" in report  # the node's own recent log
    assert report.rstrip().endswith(f"===== end of fail-stop report of session {serving['session_id']} =====")


async def test_nccl_timeout_in_engine_log_fail_stops_and_traffic_moves(
    tmp_path: Path, sink_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = sink_server
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("steady", SIMULATED, provider="lab-steady")
        broken = await mesh.add_worker(
            "nccl",
            [*SIMULATED, "--log-line", NCCL_LINE, "--log-line-after", "2"],
            "--log-sink",
            url,
            provider="lab-nccl",
        )
        await mesh.wait_serving(MODEL, 2, timeout=60)
        serving = await wait_state(mesh, "lab-nccl", ("SERVING",), timeout=10)

        results: list[tuple[int, str]] = []
        while (await record_state(mesh, "lab-nccl") or {}).get("lifecycle") != "DOWN":
            results.append(await chat(mesh))
            assert len(results) < 2000, "the NCCL line never took the node down"
        assert await broken.wait(timeout=30) == EXIT_FATAL_LOG_LINE
        results += [await chat(mesh) for _ in range(10)]

    assert {status for status, _ in results} == {200}, results
    assert "lab-nccl" in {p for _, p in results[:-10]}, "the node served before its engine logged the timeout"
    assert {p for _, p in results[-10:]} == {"lab-steady"}
    assert len(received) == 1, received
    report = received[0]
    assert report["event"] == "otela.fail_stop"
    assert report["session_id"] == serving["session_id"] and report["provider_id"] == "lab-nccl"
    assert report["exit_code"] == EXIT_FATAL_LOG_LINE
    assert report["reason"] == f"fatal engine log line: {NCCL_LINE}"
    assert NCCL_LINE in report["engine_log"]
    assert report["engine"] == "simulated" and report["engine_log_path"].endswith(".log")
    assert any("fatal line in the engine log" in line for line in report["node_log"])
    assert json.dumps(report)  # plain JSON all the way down


async def test_fatal_line_while_loading_fail_stops_before_the_ready_timeout(tmp_path: Path) -> None:
    """An engine that logs an NCCL timeout while loading and then hangs is not waited for until ready_timeout."""
    sink = tmp_path / "sink.log"
    loading = (
        "import sys, time; print('NCCL WARN bootstrap: connection timed out', flush=True); time.sleep(300)"
    )
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        worker = await mesh.add_worker(
            "loading",
            [sys.executable, "-c", loading],
            "--engine-port",
            str(free_port()),
            "--log-sink",
            str(sink),
            provider="lab-loading",
        )
        assert await worker.wait(timeout=60) == EXIT_FATAL_LOG_LINE  # ready_timeout is 900 s
        down = await wait_state(mesh, "lab-loading", ("DOWN",), timeout=10)
    assert down["reason"] == "fatal engine log line: NCCL WARN bootstrap: connection timed out"
    assert "exit=6" in sink.read_text()


async def test_engine_crash_ships_a_report_and_exits_3(tmp_path: Path) -> None:
    sink = tmp_path / "sink.log"
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        worker = await mesh.add_worker(
            "crash", [*SIMULATED, "--crash-after", "0"], "--log-sink", f"file://{sink}", provider="lab-crash"
        )
        await mesh.wait_serving(MODEL, 1, timeout=60)
        status, _ = await chat(mesh)  # the engine dies on it; no other replica to retry on
        assert await worker.wait(timeout=30) == EXIT_ENGINE_DIED
        down = await wait_state(mesh, "lab-crash", ("DOWN",), timeout=10)
    assert status >= 500
    assert down["reason"] == "engine exited with code 3"
    report = sink.read_text()
    assert "exit=3" in report.splitlines()[0]
    assert "simulated crash: exiting hard" in report  # the engine's last words
