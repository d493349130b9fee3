"""The dashboard's catalog and node map for serverless models, in headless Chromium: a cold model is listed with
its state before anything serves it, then warm with its last cold start; a node lists its engines and memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from frontend_helpers import start_frontend
from frontend_services import CHROMIUM_FLAGS

from opentela.cli.localmesh import LocalMesh
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from serverless_kit import SIMULATED, chat, serverless_mesh

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODELS = [
    {
        "id": "sim-lazy",
        "config": "SmolLM2-135M-Instruct",
        "command": SIMULATED,
        "serverless": {"memory_mib": 600},
    },
]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def lazy_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    async with serverless_mesh(tmp_path_factory.mktemp("lazy"), MODELS, {"cpu-1": 2000}) as (
        mesh,
        _controller,
    ):
        yield mesh


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def lazy_site(
    lazy_mesh: LocalMesh, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Frontend]:
    fe = await start_frontend(
        lazy_mesh.api, f"sqlite:///{tmp_path_factory.mktemp('lazy-db') / 'frontend.db'}"
    )
    try:
        yield fe
    finally:
        await fe.aclose()


async def test_a_serverless_model_goes_from_cold_to_warm_on_the_dashboard(
    lazy_mesh: LocalMesh, lazy_site: Frontend, chromium: Path
) -> None:
    playwright = pytest.importorskip("playwright.async_api", reason="playwright is part of the test extras")
    _, secret = await lazy_site.state.keys.create(KeySettings(name="viewer"))
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_FLAGS)
        try:
            page = await browser.new_page()
            await page.goto(lazy_site.url + "/")
            await page.fill("#key-input", secret)
            await page.click("#key-save")
            card = page.locator('.model-card[data-model="sim-lazy"]')
            await card.wait_for()
            text = await card.inner_text()
            assert (
                "serverless · cold" in text and "no cold start yet" in text and "started on the first" in text
            )
            assert "1 serverless" in await page.locator("#models-summary").inner_text()

            status, body, _ = await chat(lazy_mesh, "sim-lazy")
            assert status == 200, body
            await page.reload()
            await page.wait_for_function(
                "() => (document.querySelector('.model-card[data-model=\"sim-lazy\"]') || {}).innerText"
                "?.includes('serverless · warm')",
                timeout=30_000,
            )
            text = await card.inner_text()
            assert "1 of 1 replica healthy" in text and "last cold start" in text and "cpu-1" in text

            await page.click("#tab-nodes")
            row = page.locator("#nodes tr[data-peer]", has_text="cpu-1")
            await row.wait_for()
            models = await row.locator('td[data-label="Models"]').inner_text()
            assert models.strip() == "sim-lazy (600 MiB) · 600 of 2000 MiB"
            await page.close()
        finally:
            await browser.close()
