"""A client that leaves the API frontend before its answer stops the engine's work too: frontend -> ingress
connection closed -> mesh stream reset -> node closes its engine request (real processes)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from frontend_helpers import ADMIN_TOKEN, FrontendProcess

from cancel_support import LONG, SLOW_SIM, abandon, engine_active, engine_url, wait_idle
from opentela.cli.localmesh import LocalMesh

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_leaving_the_frontend_stops_the_engine(tmp_path: Path, stream: bool) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("worker", SLOW_SIM, provider="lab-a")
        await mesh.wait_serving("sim", 1, timeout=60)
        engine = engine_url(mesh, "worker")
        site = FrontendProcess(mesh.api, f"sqlite:///{tmp_path / 'frontend.db'}", tmp_path, name="cancel")
        await site.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(
                    site.url + "/admin/keys",
                    json={"name": "cancel"},
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                ) as resp:
                    assert resp.status == 201, await resp.text()
                    secret = (await resp.json())["secret"]
            auth = {"Authorization": f"Bearer {secret}"}
            await abandon(f"{site.url}/v1/chat/completions", {**LONG, "stream": stream}, 6, 1.5, auth)
            took = await wait_idle(mesh, engine, timeout=8)
            assert took < 8
            async with aiohttp.ClientSession() as http:
                assert await engine_active(http, engine) == 0
                async with http.get(site.url + "/v1/usage", headers=auth) as resp:
                    text = await resp.text()
                    assert resp.status == 200, text
                    assert "cancelled" in text  # every abandoned request is booked, none lost
        finally:
            await site.stop()
