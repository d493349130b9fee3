"""SWIM with real processes: a killed node is evicted, a paused one refutes, one paused too long rejoins anew."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]
PROBING = {
    "OTELA_REGISTRY_PROBE_INTERVAL": "0.2",
    "OTELA_REGISTRY_PROBE_TIMEOUT": "0.4",
    "OTELA_REGISTRY_INDIRECT_TIMEOUT": "0.6",
    "OTELA_REGISTRY_ANTI_ENTROPY_INTERVAL": "0.5",
}


async def mesh_with(tmp_path: Path, suspicion_timeout: float) -> LocalMesh:
    env = {**os.environ, **PROBING, "OTELA_REGISTRY_SUSPICION_TIMEOUT": str(suspicion_timeout)}
    mesh = LocalMesh(tmp_path, env=env)
    try:
        await mesh.start_ingress()
        await mesh.add_worker("worker-a", SIM, provider="lab-a")
        await mesh.add_worker("worker-b", SIM, provider="lab-b")
        await mesh.wait_serving("sim", 2, timeout=90)
    except BaseException:
        await mesh.aclose()  # a fixture that fails in setup gets no teardown: close the processes here
        raise
    return mesh


@pytest_asyncio.fixture
async def quick_eviction(tmp_path: Path) -> AsyncIterator[LocalMesh]:
    mesh = await mesh_with(tmp_path, suspicion_timeout=2.0)
    try:
        yield mesh
    finally:
        await mesh.aclose()


@pytest_asyncio.fixture
async def patient(tmp_path: Path) -> AsyncIterator[LocalMesh]:
    mesh = await mesh_with(tmp_path, suspicion_timeout=60.0)
    try:
        yield mesh
    finally:
        await mesh.aclose()


async def sessions_of(mesh: LocalMesh, provider: str) -> list[dict[str, Any]]:
    return [r for r in await mesh.get_json("/dnt/table") or [] if r["provider_id"] == provider]


async def replica(mesh: LocalMesh, provider: str) -> dict[str, Any] | None:
    return next((r for r in await mesh.replicas("sim") if r["provider_id"] == provider), None)


async def chat(mesh: LocalMesh) -> tuple[int, str]:
    body = {"model": "sim", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("X-Otela-Provider", "")


async def test_killed_node_is_excluded_then_evicted(quick_eviction: LocalMesh) -> None:
    mesh = quick_eviction
    (before,) = await sessions_of(mesh, "lab-b")
    mesh.nodes["worker-b"].signal(signal.SIGKILL, group=True)

    async def excluded() -> bool:
        r = await replica(mesh, "lab-b")
        return r is None or r["suspected"]

    await mesh.wait_for(excluded, timeout=15, what="lab-b out of routing")

    async def evicted() -> dict[str, Any] | None:
        rows = [r for r in await sessions_of(mesh, "lab-b") if r["session_id"] == before["session_id"]]
        return rows[0] if rows and rows[0]["lifecycle"] == "LEFT" else None

    left = await mesh.wait_for(evicted, timeout=30, what="lab-b evicted to LEFT at the ingress")
    assert left["signer"] != before["peer_id"], "signed by the evicting member, not the dead owner"
    assert "SWIM" in left["reason"] and left["version"] > before["version"]
    assert await replica(mesh, "lab-b") is None, "a LEFT session is out of /v1/models"
    assert [await chat(mesh) for _ in range(5)] == [(200, "lab-a")] * 5


async def test_paused_node_refutes_and_keeps_its_session(patient: LocalMesh) -> None:
    mesh = patient
    (before,) = await sessions_of(mesh, "lab-b")
    worker = mesh.nodes["worker-b"]
    worker.signal(signal.SIGSTOP)
    try:

        async def suspected() -> bool:
            r = await replica(mesh, "lab-b")
            return bool(r and r["suspected"])

        await mesh.wait_for(suspected, timeout=20, what="the paused lab-b to be suspected")
        assert {await chat(mesh) for _ in range(4)} == {(200, "lab-a")}, "a suspected node gets no requests"
    finally:
        worker.signal(signal.SIGCONT)

    async def routable() -> bool:
        r = await replica(mesh, "lab-b")
        return bool(r and not r["suspected"] and r["state"] == "SERVING")

    await mesh.wait_for(routable, timeout=30, what="lab-b to refute and be routable again")
    after = await sessions_of(mesh, "lab-b")
    assert [(r["session_id"], r["lifecycle"]) for r in after] == [(before["session_id"], "SERVING")]
    assert (await replica(mesh, "lab-b"))["session_id"] == before["session_id"]

    async def served_by_b() -> bool:
        return (await chat(mesh)) == (200, "lab-b")

    await mesh.wait_for(served_by_b, timeout=30, what="a request served by lab-b again")
    stats = await mesh.get_json("/dnt/stats")
    assert stats is not None
    assert "refuted a suspicion" in worker.log_text()


async def test_node_resumed_after_eviction_rejoins_under_a_new_session(quick_eviction: LocalMesh) -> None:
    mesh = quick_eviction
    (before,) = await sessions_of(mesh, "lab-b")
    worker = mesh.nodes["worker-b"]
    worker.signal(signal.SIGSTOP)
    try:

        async def evicted() -> bool:
            rows = await sessions_of(mesh, "lab-b")
            return any(r["session_id"] == before["session_id"] and r["lifecycle"] == "LEFT" for r in rows)

        await mesh.wait_for(evicted, timeout=30, what="the paused lab-b to be evicted")
    finally:
        worker.signal(signal.SIGCONT)

    async def rejoined() -> dict[str, Any] | None:
        r = await replica(mesh, "lab-b")
        return r if r and not r["suspected"] and r["session_id"] != before["session_id"] else None

    fresh = await mesh.wait_for(rejoined, timeout=40, what="lab-b serving under a new session")
    assert fresh["peer_id"] == before["peer_id"] and fresh["state"] == "SERVING"
    rows = {r["session_id"]: r["lifecycle"] for r in await sessions_of(mesh, "lab-b")}
    assert rows == {before["session_id"]: "LEFT", fresh["session_id"]: "SERVING"}
    assert worker.exited() is None
    assert "rejoined under a new session" in worker.log_text()


async def test_evicted_record_leaves_the_table_after_retention_then_is_compacted(tmp_path: Path) -> None:
    retention = {
        "OTELA_REGISTRY_LEFT_RETENTION": "3",
        "OTELA_REGISTRY_TOMBSTONE_RETENTION": "8",
        "OTELA_REGISTRY_REFRESH_INTERVAL": "2",
        "OTELA_REGISTRY_GC_INTERVAL": "0.5",
    }
    env = {**os.environ, **PROBING, **retention, "OTELA_REGISTRY_SUSPICION_TIMEOUT": "1"}
    async with LocalMesh(tmp_path, env=env) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("worker-a", SIM, provider="lab-a")
        await mesh.add_worker("worker-b", SIM, provider="lab-b")
        await mesh.wait_serving("sim", 2, timeout=90)
        assert len(await sessions_of(mesh, "lab-b")) == 1
        mesh.nodes["worker-b"].signal(signal.SIGKILL, group=True)

        async def evicted() -> bool:
            return [r["lifecycle"] for r in await sessions_of(mesh, "lab-b")] == ["LEFT"]

        await mesh.wait_for(evicted, timeout=30, what="lab-b evicted")

        async def hidden() -> bool:
            return await sessions_of(mesh, "lab-b") == []

        await mesh.wait_for(hidden, timeout=30, what="the LEFT record to leave the table")

        async def compacted() -> bool:
            stats = await mesh.get_json("/dnt/stats") or {}
            return stats.get("registry", {}).get("compacted", 0) >= 1

        await mesh.wait_for(compacted, timeout=30, what="the tombstone to be compacted")
        # Live nodes re-sign their records, so none of them expires meanwhile.
        assert {r["provider_id"] for r in await mesh.get_json("/dnt/table")} == {"ingress", "lab-a"}
        assert (await replica(mesh, "lab-a"))["state"] == "SERVING"
