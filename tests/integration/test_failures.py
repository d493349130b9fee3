"""Failures with real processes: a dead engine, a killed node, an engine dying mid-stream, a node that leaves."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from opentela.cli.localmesh import OTELA, LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID

pytestmark = pytest.mark.integration

ROUTING_BOUND_S = 5.0
"""A killed node must be out of the routing set within this many seconds (its TCP connection drops at once)."""


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[LocalMesh]:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        await m.add_worker("worker-a", embedded_engine_argv(threads=1), provider="lab-a")
        await m.add_worker("worker-b", embedded_engine_argv(threads=1), provider="lab-b")
        await m.wait_serving(MODEL_ID, 2, timeout=90)
        yield m


async def chat(mesh: LocalMesh, max_tokens: int = 1) -> tuple[int, str]:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Otela-Provider", "")


async def record_of(mesh: LocalMesh, provider: str) -> dict:
    table = await mesh.get_json("/dnt/table")
    return next(r for r in table if r["provider_id"] == provider and r["lifecycle"] != "LEFT")


async def test_dead_engine_marks_node_down_and_traffic_moves(mesh: LocalMesh) -> None:
    worker = mesh.nodes["worker-a"]
    engines = psutil.Process(worker.pid).children(recursive=True)
    assert engines, "worker-a should have an engine child process"
    for proc in engines:
        proc.send_signal(signal.SIGKILL)

    async def is_down() -> bool:
        table = await mesh.get_json("/dnt/table") or []
        return any(r["provider_id"] == "lab-a" and r["lifecycle"] == "DOWN" for r in table)

    await mesh.wait_for(is_down, timeout=10, what="worker-a to be DOWN at the ingress")
    assert await worker.wait(timeout=10) == 3, "a node whose engine died exits non-zero"
    results = [await chat(mesh) for _ in range(12)]
    assert results == [(200, "lab-b")] * 12


async def test_killed_node_leaves_routing_and_no_request_fails(mesh: LocalMesh) -> None:
    failures: list[int] = []
    served: list[str] = []
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            status, provider = await chat(mesh)
            (served if status == 200 else failures).append(provider if status == 200 else status)

    loader = asyncio.create_task(load())
    await asyncio.sleep(0.5)
    mesh.nodes["worker-b"].signal(signal.SIGKILL)
    killed_at = time.monotonic()

    async def excluded() -> bool:
        reps = await mesh.replicas(MODEL_ID)
        b = [r for r in reps if r["provider_id"] == "lab-b"]
        return not b or all(r["suspected"] for r in b)

    await mesh.wait_for(
        excluded, timeout=ROUTING_BOUND_S, what="lab-b to leave the routing set", interval=0.05
    )
    assert time.monotonic() - killed_at <= ROUTING_BOUND_S
    mark = len(served)
    await asyncio.sleep(1.0)
    stop.set()
    await loader
    assert failures == [], "non-streaming requests are retried on the surviving replica"
    assert served[mark:] and set(served[mark:]) == {"lab-a"}


async def test_engine_dying_mid_stream_ends_with_sse_error(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        engine = [*OTELA, "engine", "simulated", "--model", "sim", "--crash-after", "0", "--itl-ms", "20"]
        await m.add_worker("worker", engine, provider="lab")
        await m.wait_serving("sim", 1, timeout=60)
        body = {
            "model": "sim",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 50,
            "stream": True,
        }
        async with m.http().post(f"{m.api}/chat/completions", json=body) as resp:
            assert resp.status == 200
            text = (await asyncio.wait_for(resp.read(), timeout=10)).decode()
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events, text
        assert '"error"' in events[-1] and "engine_crashed" in events[-1]
        assert "[DONE]" not in events


async def test_node_without_engine_joins_then_leaves(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        idle = await m.add_worker("idle", None, provider="spare")

        async def joined() -> dict | None:
            table = await m.get_json("/dnt/table") or []
            return next((r for r in table if r["provider_id"] == "spare"), None)

        record = await m.wait_for(joined, timeout=20, what="the idle node's JOIN record")
        assert record["lifecycle"] == "JOIN" and record["models"] == []
        assert record["hardware"]["cpu"]["threads"] >= 1 and record["hardware"]["ram_mib"] > 0
        idle.signal(signal.SIGTERM)
        assert await idle.wait(timeout=15) == 0

        async def left() -> bool:
            r = await joined()
            return bool(r and r["lifecycle"] == "LEFT")

        await m.wait_for(left, timeout=10, what="the idle node's LEFT record")


async def test_bootstrap_with_wrong_peer_id_is_refused(tmp_path: Path) -> None:
    from opentela.fabric.identity import Identity

    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        impostor_id = Identity.generate().peer_id
        node = m._node(
            "liar",
            [
                "--listen",
                "127.0.0.1:0",
                "--bootstrap",
                f"{impostor_id}@{m.bootstrap}",
                "--provider-id",
                "liar",
            ],
        )
        await node.start()
        await asyncio.sleep(3)
        table = await m.get_json("/dnt/table")
        assert all(r["provider_id"] != "liar" for r in table)
        assert "peer id" in node.log_text().lower() or "handshake" in node.log_text().lower()


async def post_chat(mesh: LocalMesh, model: str) -> tuple[int, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        return resp.status, await resp.json()


async def test_known_model_without_healthy_replica_is_503(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        worker = await m.add_worker(
            "worker", [*OTELA, "engine", "simulated", "--model", "sim"], provider="lab"
        )
        await m.wait_serving("sim", 1, timeout=60)
        for proc in psutil.Process(worker.pid).children(recursive=True):
            proc.send_signal(signal.SIGKILL)
        await worker.wait(timeout=10)
        status, payload = await post_chat(m, "sim")
        assert status == 503, payload
        assert "no healthy replica" in payload["error"]["message"]
        status, payload = await post_chat(m, "other")
        assert status == 404 and "none are being served" in payload["error"]["message"]


async def test_engine_dying_before_answering_is_502(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        engine = [*OTELA, "engine", "simulated", "--model", "sim", "--crash-after", "0", "--ttft-ms", "50"]
        await m.add_worker("worker", engine, provider="lab")
        await m.wait_serving("sim", 1, timeout=60)
        status, payload = await post_chat(m, "sim")
        assert status in (502, 503), payload
        assert payload["error"]["code"] in ("engine_crashed", "no_healthy_replica", "engine_unavailable")


async def test_engine_that_hangs_is_504_after_the_first_byte_timeout(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress(
            env={"OTELA_GATEWAY_FIRST_BYTE_TIMEOUT": "1.0", "OTELA_GATEWAY_MAX_RETRIES": "0"}
        )
        engine = [*OTELA, "engine", "simulated", "--model", "sim", "--hang-after", "0"]
        await m.add_worker("worker", engine, provider="lab")
        await m.wait_serving("sim", 1, timeout=60)
        started = time.monotonic()
        status, payload = await post_chat(m, "sim")
        assert status == 504, payload
        assert payload["error"]["type"] == "timeout_error"
        assert time.monotonic() - started < 10
