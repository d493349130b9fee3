"""Partial views with real processes: six nodes with an active view of two still converge and evict a dead node."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from opentela.cli.localmesh import OTELA, LocalMesh, free_port

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]
SMALL_VIEWS = {
    "OTELA_REGISTRY_ACTIVE_VIEW": "2",
    "OTELA_REGISTRY_PASSIVE_VIEW": "4",
    "OTELA_REGISTRY_SHUFFLE_INTERVAL": "1",
    "OTELA_REGISTRY_ACTIVE_WALK": "3",
    "OTELA_REGISTRY_PASSIVE_WALK": "1",
    "OTELA_REGISTRY_PASSIVE_ANTI_ENTROPY": "0.3",
    "OTELA_REGISTRY_ANTI_ENTROPY_INTERVAL": "0.5",
    "OTELA_REGISTRY_PROBE_INTERVAL": "0.2",
    "OTELA_REGISTRY_PROBE_TIMEOUT": "0.4",
    "OTELA_REGISTRY_INDIRECT_TIMEOUT": "0.6",
    "OTELA_REGISTRY_SUSPICION_TIMEOUT": "2",
}
INGRESSES = 4  # each with its own API, so every replica can be read; plus two workers: six nodes


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[LocalMesh, list[str]]]:
    async with LocalMesh(tmp_path, env={**os.environ, **SMALL_VIEWS}) as m:
        await m.start_ingress()
        apis = [m.api]
        for i in range(1, INGRESSES):
            port = free_port()
            # Later flags win: each extra ingress listens anywhere and joins through the first one.
            await m.start_ingress(
                "--listen",
                "127.0.0.1:0",
                "--http",
                f"127.0.0.1:{port}",
                "--bootstrap",
                m.bootstrap,
                "--provider-id",
                f"ingress-{i}",
                name=f"ingress-{i}",
            )
            apis.append(f"http://127.0.0.1:{port}/v1")
        await m.add_worker("worker-a", SIM, provider="lab-a")
        await m.add_worker("worker-b", SIM, provider="lab-b")
        yield m, apis


async def get(mesh: LocalMesh, api: str, path: str) -> Any:
    try:
        async with mesh.http().get(api + path) as resp:
            return await resp.json() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def providers_serving(mesh: LocalMesh, api: str) -> set[str]:
    listing = await get(mesh, api, "/models") or {"data": []}
    replicas = next((m["replicas"] for m in listing["data"] if m["id"] == "sim"), [])
    return {r["provider_id"] for r in replicas if r["state"] == "SERVING" and not r["suspected"]}


async def test_six_nodes_with_an_active_view_of_two_converge_and_evict(
    mesh: tuple[LocalMesh, list[str]],
) -> None:
    m, apis = mesh

    async def everyone_sees_both() -> bool:
        return all([await providers_serving(m, api) == {"lab-a", "lab-b"} for api in apis])

    await m.wait_for(everyone_sees_both, timeout=90, what="every ingress to see both replicas")
    for api in apis:
        stats = await get(m, api, "/dnt/stats")
        assert stats is not None and 1 <= stats["view"]["active"] <= 2, stats and stats.get("view")
        assert stats["membership"]["watched"] <= 2, "SWIM probes the neighbours only"
    table = await get(m, apis[0], "/dnt/table")
    (victim,) = [r for r in table if r["provider_id"] == "lab-b" and r["lifecycle"] == "SERVING"]

    m.nodes["worker-b"].signal(signal.SIGKILL, group=True)
    killed_at = time.monotonic()

    async def evicted_everywhere() -> bool:
        for api in apis:
            rows = await get(m, api, "/dnt/table") or []
            mine = [r for r in rows if r["session_id"] == victim["session_id"]]
            if not mine or mine[0]["lifecycle"] != "LEFT":
                return False
        return True

    await m.wait_for(evicted_everywhere, timeout=60, interval=0.05, what="the killed worker LEFT everywhere")
    took = time.monotonic() - killed_at
    print(f"killed worker LEFT at every ingress {took:.2f} s after the kill")
    # Its two neighbours suspect it at once (their connections reset) and evict it after the 2 s suspicion
    # timeout; the others hold their own failed ping by then, so the flood is not held up anywhere.
    assert took < 15
    rows = await get(m, apis[-1], "/dnt/table")
    left = next(r for r in rows if r["session_id"] == victim["session_id"])
    assert "SWIM" in left["reason"] and left["signer"] != victim["peer_id"]
    assert [await providers_serving(m, api) for api in apis] == [{"lab-a"}] * len(apis)
