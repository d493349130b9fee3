"""A member that evicts healthy nodes, or uses dial-back to probe other hosts, against real `otela start` processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from malicious_member import MaliciousMember

from opentela._types import PROTO_RELAY, Lifecycle
from opentela.cli.localmesh import OTELA, LocalMesh
from opentela.fabric.messages import read_msg, write_msg

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[LocalMesh]:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        await m.add_worker("worker-a", SIM, provider="lab-a")
        await m.wait_serving("sim", 1, timeout=60)
        yield m


async def victim_row(mesh: LocalMesh) -> dict[str, Any]:
    table = await mesh.get_json("/dnt/table")
    return next(r for r in table if r["provider_id"] == "lab-a" and r["lifecycle"] == "SERVING")


async def state_of(mesh: LocalMesh, session: str) -> str | None:
    table = await mesh.get_json("/dnt/table") or []
    return next((r["lifecycle"] for r in table if r["session_id"] == session), None)


async def chat(mesh: LocalMesh) -> int:
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def member(mesh: LocalMesh, name: str) -> MaliciousMember:
    """A member with a (JOIN, model-less) record of its own at the ingress, so its evictions are considered."""
    m = await MaliciousMember.join(mesh.bootstrap)
    await m.push([m.record(provider_id=name, lifecycle=Lifecycle.JOIN, models=())])

    async def known() -> bool:
        return any(r["peer_id"] == m.peer_id for r in await mesh.get_json("/dnt/table") or [])

    await mesh.wait_for(known, timeout=15, what=f"{name}'s record at the ingress")
    return m


async def membership_stats(mesh: LocalMesh) -> dict[str, Any]:
    stats = await mesh.get_json("/dnt/stats")
    return stats["membership"]


async def test_one_member_cannot_evict_a_healthy_node(mesh: LocalMesh) -> None:
    row = await victim_row(mesh)
    session = row["session_id"]
    mallory = await member(mesh, "mallory")
    try:
        worker = await mallory.host.connect(row["addrs"][0])
        statuses: list[int] = []
        for _ in range(10):  # at the ingress and at the victim itself, each time a freshly signed eviction
            await mallory.push([mallory.eviction(row)])
            await mallory.push([mallory.eviction(row)], to=worker)
            statuses.append(await chat(mesh))
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # probes of the victim have answered, gossip has settled
        assert await state_of(mesh, session) == "SERVING"
        assert (await victim_row(mesh))["session_id"] == session, "the victim must not have rejoined"
        statuses += [await chat(mesh) for _ in range(5)]
        assert statuses == [200] * len(statuses)
        stats = await membership_stats(mesh)
        assert stats["evictions_unconfirmed"] >= 1, stats
        assert stats["evictions_rate_limited"] >= 1, stats
        assert stats["evictions_confirmed"] == 0 and stats["evictions_quorum"] == 0, stats
        registry = (await mesh.get_json("/dnt/stats"))["registry"]
        assert registry["by_state"].get("LEFT", 0) == 0, registry

        # A quorum (3 by default) of distinct members is another matter: the ingress merges, and the victim,
        # which hears from the ingress that its replica holds the session LEFT, rejoins under a new session.
        others = [await member(mesh, "trent"), await member(mesh, "victor")]
        try:
            for m in others:
                await m.push([m.eviction(row)])

            async def evicted() -> bool:
                return await state_of(mesh, session) == "LEFT"

            await mesh.wait_for(evicted, timeout=10, what="the quorum's eviction to merge at the ingress")
            assert (await membership_stats(mesh))["evictions_quorum"] >= 1

            async def rejoined() -> bool:
                table = await mesh.get_json("/dnt/table") or []
                return any(
                    r["provider_id"] == "lab-a" and r["lifecycle"] == "SERVING" and r["session_id"] != session
                    for r in table
                )

            await mesh.wait_for(rejoined, timeout=20, what="the evicted worker to rejoin")
        finally:
            for m in others:
                await m.aclose()
    finally:
        await mallory.aclose()


async def dial_back(m: MaliciousMember, addrs: list[str]) -> Any:
    stream = await m.open(PROTO_RELAY)
    try:
        await write_msg(stream, {"t": "dialback", "addrs": addrs})
        return await read_msg(stream, 64 * 1024)
    finally:
        await stream.aclose()


async def test_dial_back_only_reaches_the_askers_own_addresses(mesh: LocalMesh) -> None:
    async with await MaliciousMember.join(mesh.bootstrap) as mallory:
        own = mallory.host.listen_addrs[0]  # on loopback, like the ingress: this host is the asker's own
        others = ["169.254.169.254:80", "192.0.2.1:80", "8.8.8.8:53"]
        reply = await dial_back(mallory, [*others, own])
        assert reply["ok"] and reply["reachable"] == [own], reply
        assert sorted(reply["refused"]) == sorted(others), reply

        replies = [await dial_back(mallory, [own]) for _ in range(6)]
        assert [r["ok"] for r in replies].count(False) >= 3, replies  # a few per minute per peer
        relay = (await mesh.get_json("/dnt/stats"))["relay"]
        assert relay["dial_back_refused"] == len(others), relay
        assert relay["dial_back_rate_limited"] >= 3, relay
