"""A real network partition between two namespaces: each half keeps serving; after healing, registries agree."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from tests_support_netns import Namespaces, in_ns, require_netns

from opentela.cli.localmesh import OTELA, NodeProcess

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]
# Eviction must not outrun the partition: this test is about routing and convergence, not SWIM verdicts.
ENV = {**os.environ, "OTELA_REGISTRY_SUSPICION_TIMEOUT": "300", "OTELA_REGISTRY_PROBE_INTERVAL": "0.3"}


class Half:
    """One side of the partition: an ingress and its workers in one namespace."""

    def __init__(self, ns: str, mesh_ip: str, api_ip: str, tmp: Path, label: str) -> None:
        self.ns, self.mesh_ip, self.label, self.tmp = ns, mesh_ip, label, tmp
        self.api = f"http://{api_ip}:8092/v1"
        self.nodes: list[NodeProcess] = []

    async def start(self, name: str, *args: str, engine: list[str] | None = None) -> NodeProcess:
        argv = [
            *OTELA,
            "start",
            "--key-file",
            str(self.tmp / f"{name}.key"),
            "--log-dir",
            str(self.tmp),
            *args,
        ]
        if engine:
            argv += ["--", *engine]
        node = NodeProcess(name, in_ns(self.ns, argv), self.tmp / f"{name}.log", ENV)
        await node.start()
        self.nodes.append(node)
        return node


@pytest_asyncio.fixture
async def halves(tmp_path: Path) -> AsyncIterator[tuple[Half, Half, Namespaces, str]]:
    require_netns()
    spaces = Namespaces()
    halves_made: list[Half] = []
    try:
        a, b = spaces.add("a"), spaces.add("b")
        cut_dev, _ = spaces.link(a, "10.77.0.1", b, "10.77.0.2")  # the mesh link between the halves
        spaces.link(a, "10.78.1.2", None, "10.78.1.1")  # the test's own way into each half
        spaces.link(b, "10.78.2.2", None, "10.78.2.1")
        left, right = (
            Half(a, "10.77.0.1", "10.78.1.2", tmp_path, "a"),
            Half(b, "10.77.0.2", "10.78.2.2", tmp_path, "b"),
        )
        halves_made += [left, right]
        boot = "10.77.0.1:4701"
        await left.start(
            "ingress-a",
            "--role",
            "ingress",
            "--listen",
            boot,
            "--http",
            "0.0.0.0:8092",
            "--provider-id",
            "ia",
        )
        await right.start(
            "ingress-b",
            "--role",
            "ingress",
            "--listen",
            "10.77.0.2:4702",
            "--http",
            "0.0.0.0:8092",
            "--bootstrap",
            boot,
            "--provider-id",
            "ib",
        )
        await left.start(
            "worker-a", "--listen", "10.77.0.1:0", "--bootstrap", boot, "--provider-id", "lab-a", engine=SIM
        )
        await right.start(
            "worker-b", "--listen", "10.77.0.2:0", "--bootstrap", boot, "--provider-id", "lab-b", engine=SIM
        )
        yield left, right, spaces, cut_dev
    finally:
        nodes = [n for h in halves_made for n in h.nodes]
        await asyncio.gather(*(n.stop() for n in reversed(nodes)), return_exceptions=True)
        spaces.close()


async def get(http: aiohttp.ClientSession, url: str) -> object:
    try:
        async with http.get(url) as resp:
            return await resp.json() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def healthy_providers(http: aiohttp.ClientSession, half: Half) -> set[str]:
    listing = await get(http, f"{half.api}/models") or {"data": []}
    reps = next((m["replicas"] for m in listing["data"] if m["id"] == "sim"), [])
    return {r["provider_id"] for r in reps if r["state"] == "SERVING" and not r["suspected"]}


async def until(pred, timeout: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await pred():  # noqa: ASYNC110 (polling the nodes over HTTP)
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


async def served_by(http: aiohttp.ClientSession, half: Half) -> str:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(f"{half.api}/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Otela-Provider"]


def table_key(table: list[dict]) -> set[tuple[str, str, int]]:
    return {(r["session_id"], r["lifecycle"], r["version"]) for r in table}


async def test_partition_keeps_both_halves_serving_then_converges(halves) -> None:
    left, right, spaces, cut_dev = halves
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        both = {"lab-a", "lab-b"}
        for half in (left, right):
            await until(
                lambda h=half: _eq(healthy_providers(http, h), both), 60, f"both replicas at {half.label}"
            )

        spaces.set_link(left.ns, cut_dev, up=False)
        await until(lambda: _eq(healthy_providers(http, left), {"lab-a"}), 20, "A to stop routing to B")
        await until(lambda: _eq(healthy_providers(http, right), {"lab-b"}), 20, "B to stop routing to A")
        assert {await served_by(http, left) for _ in range(8)} == {"lab-a"}
        assert {await served_by(http, right) for _ in range(8)} == {"lab-b"}

        # Something changes on one side while the other cannot hear it.
        await right.start(
            "worker-b2",
            "--listen",
            "10.77.0.2:0",
            "--bootstrap",
            "10.77.0.2:4702",
            "--provider-id",
            "lab-b2",
            engine=SIM,
        )
        await until(lambda: _eq(healthy_providers(http, right), {"lab-b", "lab-b2"}), 30, "B2 serving at B")
        assert await healthy_providers(http, left) == {"lab-a"}

        spaces.set_link(left.ns, cut_dev, up=True)
        everyone = {"lab-a", "lab-b", "lab-b2"}
        for half in (left, right):
            await until(
                lambda h=half: _eq(healthy_providers(http, h), everyone), 40, f"healing at {half.label}"
            )

        async def same_tables() -> bool:
            ta, tb = await get(http, f"{left.api}/dnt/table"), await get(http, f"{right.api}/dnt/table")
            return bool(ta and tb and table_key(ta) == table_key(tb))

        await until(same_tables, 30, "identical registries")


async def _eq(coro, want: set[str]) -> bool:
    return await coro == want
