"""A replica reconfiguring on the dashboard, in headless Chromium: two nodes each supervising a stand-in
tensor-parallel engine (a child process whose advertised state the test flips); while one reconfigures, its catalog
entry and its row in the node map carry a RECONFIGURING badge with its TP degree and healthy ranks, instead of
looking down, and the frontend's /v1/models says the same."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import start_frontend
from frontend_services import CHROMIUM_FLAGS

from opentela.cli.localmesh import LocalMesh
from opentela.engines.base import free_port
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from reconfiguring_engine import MODEL, RECONFIGURING, SERVING, flip, standin_argv

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def tp_mesh(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[LocalMesh, dict[str, int]]]:
    workdir = tmp_path_factory.mktemp("reconfiguring")
    config = workdir / "node.toml"
    config.write_text("[node]\nstate_interval = 0.2\n")
    ports = {"lab-a": free_port(), "lab-b": free_port()}
    async with LocalMesh(workdir) as mesh:
        await mesh.start_ingress()
        for provider, port in ports.items():
            await mesh.add_worker(provider, standin_argv(port), "--config", str(config), provider=provider)
        await mesh.wait_serving(MODEL, 2, timeout=60)
        yield mesh, ports


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def tp_site(
    tp_mesh: tuple[LocalMesh, dict[str, int]], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Frontend]:
    fe = await start_frontend(tp_mesh[0].api, f"sqlite:///{tmp_path_factory.mktemp('tp-db') / 'frontend.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


async def _replica_state(mesh: LocalMesh, provider: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = [r for r in await mesh.replicas(MODEL) if r["provider_id"] == provider]
        return found[0] if found and found[0]["replica_state"] == state else None

    return await mesh.wait_for(probe, timeout=15, what=f"{provider} to be {state} at the ingress")


async def test_a_reconfiguring_replica_has_its_badge_and_ranks_on_the_dashboard(
    tp_mesh: tuple[LocalMesh, dict[str, int]], tp_site: Frontend, chromium: Path
) -> None:
    playwright = pytest.importorskip("playwright.async_api", reason="playwright is part of the test extras")
    mesh, ports = tp_mesh
    _, secret = await tp_site.state.keys.create(KeySettings(name="viewer"))
    await flip(ports["lab-a"], RECONFIGURING, "0,2")
    try:
        await _replica_state(mesh, "lab-a", RECONFIGURING)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
            async with http.get(tp_site.url + "/v1/models") as r:
                listing = await r.json()
        replicas = {x["provider_id"]: x for x in listing["data"][0]["replicas"]}
        assert (replicas["lab-a"]["replica_state"], replicas["lab-a"]["tp_ranks"]) == (RECONFIGURING, [0, 2])
        assert (replicas["lab-b"]["replica_state"], replicas["lab-b"]["tp_degree"]) == (SERVING, 3)

        async with playwright.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_FLAGS)
            try:
                page = await browser.new_page()
                await page.goto(tp_site.url + "/")
                await page.fill("#key-input", secret)
                await page.click("#key-save")
                card = page.locator(f'.model-card[data-model="{MODEL}"]')
                await card.wait_for()
                await page.wait_for_function(
                    "() => document.querySelectorAll('.model-card .replica').length >= 2", timeout=30_000
                )
                assert "1 of 2 replicas healthy, 1 reconfiguring" in await card.inner_text()
                moving = card.locator(".replica", has_text="lab-a")
                assert await moving.locator(".badge.RECONFIGURING").inner_text() == "RECONFIGURING"
                assert await moving.locator(".badge.SERVING").count() == 0
                assert "TP 2 · ranks 0, 2" in await moving.inner_text()
                serving = card.locator(".replica", has_text="lab-b")
                assert await serving.locator(".badge.SERVING").count() == 1
                assert await serving.locator(".badge.RECONFIGURING").count() == 0
                assert "TP 3 · ranks 0, 1, 2" in await serving.inner_text()

                await page.click("#tab-nodes")
                row = page.locator("#nodes tr[data-peer]", has_text="lab-a")
                await row.wait_for()
                assert (
                    await row.locator('td[data-label="Lifecycle"]').inner_text()
                ).strip() == "RECONFIGURING"
                assert "TP 2 · ranks 0,2" in await row.locator('td[data-label="Models"]').inner_text()
                other = page.locator("#nodes tr[data-peer]", has_text="lab-b")
                assert (await other.locator('td[data-label="Lifecycle"]').inner_text()).strip() == "SERVING"

                await flip(ports["lab-a"], SERVING, "0,2")
                await _replica_state(mesh, "lab-a", SERVING)
                await page.click("#tab-models")
                await page.wait_for_function(
                    "() => (document.querySelector('.model-card') || {}).innerText"
                    "?.includes('2 of 2 replicas healthy')",
                    timeout=30_000,
                )
                assert await card.locator(".badge.RECONFIGURING").count() == 0
                await page.close()
            finally:
                await browser.close()
    finally:
        await flip(ports["lab-a"], SERVING)
