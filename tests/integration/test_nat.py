"""A worker behind a firewall that drops inbound connections joins through a relay and serves through it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest
from tests_support_netns import Namespaces, drop_inbound_connections, in_ns, require_netns

from opentela.cli.localmesh import OTELA, NodeProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("reachability", ["private", "auto"])
async def test_private_worker_serves_through_a_relay(tmp_path: Path, reachability: str) -> None:
    require_netns()
    spaces = Namespaces()
    nodes: list[NodeProcess] = []
    env = {**os.environ, "OTELA_LOG_LEVEL": "INFO"}

    async def start(name: str, ns: str, *args: str) -> NodeProcess:
        argv = [
            *OTELA,
            "start",
            "--key-file",
            str(tmp_path / f"{name}.key"),
            "--log-dir",
            str(tmp_path),
            *args,
        ]
        node = NodeProcess(name, in_ns(ns, argv), tmp_path / f"{name}.log", env)
        await node.start()
        nodes.append(node)
        return node

    try:
        relay_ns, ingress_ns, worker_ns = spaces.add("r"), spaces.add("i"), spaces.add("w")
        spaces.link(relay_ns, "10.81.1.1", ingress_ns, "10.81.1.2")
        spaces.link(relay_ns, "10.81.2.1", worker_ns, "10.81.2.2")
        spaces.link(ingress_ns, "10.82.0.2", None, "10.82.0.1")  # the test's way in
        drop_inbound_connections(worker_ns)
        # No route joins the ingress's and the worker's subnets: every byte between them crosses the relay.
        await start(
            "relay",
            relay_ns,
            "--listen",
            "0.0.0.0:4901",
            "--advertise",
            "10.81.1.1:4901",
            "--provider-id",
            "r",
        )
        await start(
            "ingress",
            ingress_ns,
            "--role",
            "ingress",
            "--listen",
            "10.81.1.2:4902",
            "--http",
            "0.0.0.0:8092",
            "--bootstrap",
            "10.81.1.1:4901",
            "--provider-id",
            "i",
        )
        await start(
            "worker",
            worker_ns,
            "--reachability",
            reachability,
            "--listen",
            "10.81.2.2:0",  # its real address: only the firewall stops inbound connections
            "--bootstrap",
            "10.81.2.1:4901",
            "--provider-id",
            "hpc-lab",
            "--",
            *OTELA,
            "engine",
            "simulated",
            "--model",
            "sim",
        )
        api = "http://10.82.0.2:8092/v1"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:

            async def serving() -> list[dict]:
                try:
                    async with http.get(f"{api}/models") as resp:
                        data = (await resp.json())["data"]
                except (aiohttp.ClientError, TimeoutError):
                    return []
                reps = next((m["replicas"] for m in data if m["id"] == "sim"), [])
                return [r for r in reps if r["state"] == "SERVING" and not r["suspected"]]

            async def relayed_record() -> dict | None:
                try:
                    async with http.get(f"{api}/dnt/table") as resp:
                        table = await resp.json()
                except (aiohttp.ClientError, TimeoutError):
                    return None
                rec = next((r for r in table if r["provider_id"] == "hpc-lab"), None)
                addrs = rec["addrs"] if rec else []
                return rec if addrs and all(a.endswith("/p2p-circuit") for a in addrs) else None

            # With `auto`, the node first advertises its address, then learns nobody can dial it.
            async with asyncio.timeout(30):
                while not await relayed_record():  # noqa: ASYNC110 (polling over HTTP)
                    await asyncio.sleep(0.3)
            async with asyncio.timeout(60):
                while not await serving():  # noqa: ASYNC110 (polling over HTTP)
                    await asyncio.sleep(0.3)

            body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with http.post(f"{api}/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-Otela-Provider"] == "hpc-lab"
                assert (await resp.json())["choices"][0]["message"]["content"]
            async with http.get(f"{api}/dnt/stats") as resp:
                relay_stats = (await resp.json())["relay"]
            assert relay_stats["relayed_out"] + relay_stats["relayed_in"] >= 1, relay_stats
    finally:
        await asyncio.gather(*(n.stop() for n in reversed(nodes)), return_exceptions=True)
        spaces.close()
