"""Shared by the cancellation tests: a mesh whose simulated engine generates slowly, and its engine's load."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from opentela.cli.localmesh import OTELA, LocalMesh

# 300 tokens at 100 ms each: a request left alone runs for 30 s.
SLOW_SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "50", "--itl-ms", "100"]
LONG = {"model": "sim", "messages": [{"role": "user", "content": "write a lot"}], "max_tokens": 300}


def engine_url(mesh: LocalMesh, worker: str) -> str:
    """The simulated engine's own URL, from the worker's log."""
    found = re.search(r"engine\s+simulated on (http://[\d.]+:\d+)", mesh.nodes[worker].log_text())
    assert found, mesh.nodes[worker].log_tail()
    return found.group(1)


async def engine_active(http: aiohttp.ClientSession, url: str) -> int:
    """Requests the engine is generating for right now."""
    async with http.get(url + "/health") as resp:
        return int((await resp.json())["active"])


async def abandon(url: str, body: dict[str, Any], n: int, after: float, headers: dict[str, str]) -> None:
    """Send `n` requests and hang up on all of them after `after` seconds (streams read their first bytes)."""

    async def one(http: aiohttp.ClientSession) -> None:
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            async for _ in resp.content.iter_any():
                pass

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(one(http)) for _ in range(n)]
        await asyncio.sleep(after)
        for t in tasks:
            assert not t.done(), t  # still generating when the client leaves
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # Leaving the session closes every connection: the server side sees the clients go.


async def wait_idle(mesh: LocalMesh, url: str, timeout: float) -> float:
    """Seconds until the engine has nothing in flight; fails after `timeout`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with aiohttp.ClientSession() as http:

        async def idle() -> bool:
            return await engine_active(http, url) == 0

        await mesh.wait_for(idle, timeout=timeout, what="the engine to drop the abandoned requests")
    return loop.time() - start
