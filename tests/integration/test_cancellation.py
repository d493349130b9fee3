"""A client that hangs up stops the engine's work: ingress -> mesh stream reset -> node closes its engine request
(real processes; the simulated engine generates for 30 s if nobody stops it)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from cancel_support import LONG, SLOW_SIM, abandon, engine_active, engine_url, wait_idle
from opentela.cli.localmesh import LocalMesh

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_abandoned_requests_stop_the_engine(tmp_path: Path, stream: bool) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("worker", SLOW_SIM, provider="lab-a")
        await mesh.wait_serving("sim", 1, timeout=60)
        engine = engine_url(mesh, "worker")
        await abandon(f"{mesh.api}/chat/completions", {**LONG, "stream": stream}, 10, 1.5, {})
        took = await wait_idle(mesh, engine, timeout=8)
        assert took < 8
        async with aiohttp.ClientSession() as http:
            assert await engine_active(http, engine) == 0
        # The mesh is no worse for it: the next request is answered.
        async with mesh.http().post(f"{mesh.api}/chat/completions", json={**LONG, "max_tokens": 2}) as resp:
            assert resp.status == 200, await resp.text()
