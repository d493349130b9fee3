"""The dashboard in headless Chromium (Debian's, driven by Playwright): catalog, node map, keys, playground, usage
and the workload; a model alias on its target's card.

Set OTELA_UPDATE_SCREENSHOTS=1 to refresh docs/screenshots/ from this run.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, seed_usage, start_frontend, workload_rows
from frontend_services import CHROMIUM_FLAGS
from sqlalchemy import select

from opentela.cli.localmesh import LocalMesh, free_port
from opentela.engines.embedded import MODEL_ID
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
LAPTOP = {"width": 1366, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def site(mesh: LocalMesh, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Frontend]:
    fe = await start_frontend(mesh.api, f"sqlite:///{tmp_path_factory.mktemp('dash') / 'frontend.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def browser(chromium: Path) -> AsyncIterator:
    playwright = pytest.importorskip("playwright.async_api", reason="playwright is part of the test extras")
    async with playwright.async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


# The dashboard's Content-Security-Policy forbids eval, so every wait_for_function predicate is a function
# (Playwright calls those directly) rather than an expression string (which it would eval).


async def _snap(page, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    if os.environ.get("OTELA_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / path.name)


@pytest.mark.parametrize(("device", "viewport"), [("laptop", LAPTOP), ("phone", PHONE)])
async def test_catalog_and_node_map_show_the_demo_mesh(
    site: Frontend, browser, shots: Path, device: str, viewport: dict
) -> None:
    _, secret = await site.state.keys.create(KeySettings(name=f"viewer-{device}"))
    page = await browser.new_page(viewport=viewport)
    await page.goto(site.url + "/")
    # The node map is for key holders: without a key the page asks for one instead of showing the mesh.
    await page.locator("#models .needs-key").wait_for()
    await page.fill("#key-input", secret)
    await page.click("#key-save")
    card = page.locator(f'.model-card[data-model="{MODEL_ID}"]')
    await card.wait_for()
    await page.wait_for_function(
        "() => document.querySelectorAll('.model-card .replica').length >= 2", timeout=30_000
    )
    text = await card.inner_text()
    assert "2 of 2 replicas healthy" in text
    assert "demo-provider-1" in text and "demo-provider-2" in text and "SERVING" in text
    assert "CPU" in text  # hardware of each replica
    # Clean on a small screen too: nothing wider than the viewport.
    assert await page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth")
    await _snap(page, shots, f"{device}-models")
    await page.click("#tab-nodes")
    await page.wait_for_function(
        "() => document.querySelectorAll('#nodes tr[data-peer]').length >= 3", timeout=30_000
    )
    rows = page.locator("#nodes tr[data-peer]")
    by_provider = {}
    for i in range(await rows.count()):
        row = rows.nth(i)
        by_provider[
            (await row.locator('td[data-label="Provider"]').inner_text()).strip()
        ] = await row.inner_text()
    assert set(by_provider) == {"ingress", "demo-provider-1", "demo-provider-2"}
    assert all("healthy" in r for r in by_provider.values())
    # The workers serve the model; the demo's ingress runs no engine, so it stays in JOIN.
    assert "SERVING" in by_provider["demo-provider-1"] and "SERVING" in by_provider["demo-provider-2"]
    assert "JOIN" in by_provider["ingress"] and "(ingress)" in by_provider["ingress"]
    await _snap(page, shots, f"{device}-nodes")
    await page.close()


async def test_admin_creates_and_revokes_a_key(site: Frontend, browser, shots: Path) -> None:
    page = await browser.new_page(viewport=LAPTOP)
    page.on("dialog", lambda d: d.accept())
    await page.goto(site.url + "/#keys")
    await page.fill("#admin-token", "otela-admin-wrong")
    await page.click("#admin-save")
    await page.wait_for_function(
        "() => document.querySelector('#admin-status').textContent.includes('refused')"
    )
    await page.fill("#admin-token", ADMIN_TOKEN)
    await page.click("#admin-save")
    await page.locator("#create-key-form").wait_for()
    await page.fill("#new-key-name", "browser-user")
    await page.fill("input[name=rpm_limit]", "60")
    await page.click("#create-key")
    secret = (await page.locator("#new-secret-value").inner_text()).strip()
    assert secret.startswith("otela-")
    row = page.locator('.key-row[data-name="browser-user"]')
    await row.wait_for()
    assert "active" in await row.inner_text() and "60 rpm" in await row.inner_text()
    await _snap(page, shots, "laptop-keys")
    key = await site.state.keys.authenticate(secret)
    await row.locator(".revoke-btn").click()
    await page.wait_for_function(
        "() => document.querySelector('.key-row[data-name=\"browser-user\"]').innerText.includes('revoked')"
    )
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        async with http.get(site.url + "/v1/models") as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "api_key_revoked"
    assert (await site.state.keys.get(key.id)).revoked_at is not None
    await page.close()


@pytest.mark.parametrize(("device", "viewport"), [("laptop", LAPTOP), ("phone", PHONE)])
async def test_playground_streams_a_real_answer(
    site: Frontend, browser, shots: Path, device: str, viewport: dict
) -> None:
    key, secret = await site.state.keys.create(KeySettings(name=f"playground-{device}"))
    page = await browser.new_page(viewport=viewport)
    await page.goto(site.url + "/#playground")
    await page.fill("#key-input", secret)
    await page.click("#key-save")
    await page.wait_for_function("() => document.querySelector('#key-status').textContent.includes('active')")
    await page.wait_for_function(f"() => document.querySelector('#chat-model').value === '{MODEL_ID}'")
    # Count how often the answer grows: a streamed answer arrives in several updates, not in one piece.
    await page.evaluate(
        """() => { window.__updates = 0; new MutationObserver(() => window.__updates++).observe(
             document.querySelector('#chat-log'), {subtree: true, characterData: true, childList: true}); }"""
    )
    await page.fill("#chat-max", "24")
    await page.fill("#chat-input", "What is the capital of France?")
    async with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answered:
        await page.press("#chat-input", "Enter")
    response = await answered.value
    await page.wait_for_function(
        "() => document.querySelector('#chat-meta').textContent.includes('tokens')", timeout=90_000
    )
    answer = await page.locator(".msg.assistant").last.inner_text()
    meta = await page.locator("#chat-meta").inner_text()
    assert answer.strip() and "demo-provider-" in meta
    # Streamed: the page asked for an event stream and got the answer in many events. How many DOM updates that
    # makes depends on how the events were batched into network reads, so the page only has to have grown it.
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in (await response.body()).split(b"\n") if line.startswith(b"data: {")]
    assert len(events) >= 3
    assert await page.evaluate("window.__updates") >= 2
    async with site.state.db.session() as s:
        rows = (await s.scalars(select(UsageRow).where(UsageRow.key_id == key.id))).all()
    assert [(r.status, r.stream) for r in rows] == [("ok", True)] and rows[0].output_tokens > 0
    await _snap(page, shots, f"{device}-playground")
    await page.click("#tab-usage")
    await page.locator("#usage-chart svg").wait_for()
    await page.wait_for_function(
        "() => document.querySelectorAll('#usage-rows tbody tr .badge.ok').length >= 1"
    )
    await _snap(page, shots, f"{device}-usage")
    await page.close()


async def test_api_reference_renders_offline(site: Frontend, browser, shots: Path) -> None:
    page = await browser.new_page(viewport=LAPTOP)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    await page.goto(site.url + "/docs")
    await page.locator(".swagger-ui .opblock-summary-path", has_text="/v1/chat/completions").first.wait_for()
    assert failed == []  # every asset came from the frontend itself
    await _snap(page, shots, "laptop-docs")
    await page.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def seeded_workload(site: Frontend) -> None:
    """The usage rows of tests/frontend/test_workload.py, whose statistics are known."""
    await seed_usage(site.state.db, workload_rows(time.time()))


@pytest.mark.parametrize(("device", "viewport"), [("laptop", LAPTOP), ("phone", PHONE)])
async def test_workload_tab_draws_the_trace_analysis_of_the_window(
    site: Frontend, seeded_workload: None, browser, shots: Path, device: str, viewport: dict
) -> None:
    page = await browser.new_page(viewport=viewport)
    await page.add_init_script(
        "window.__csp = []; document.addEventListener('securitypolicyviolation', "
        "(e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
    )
    await page.goto(site.url + "/#workload")
    # Every key's traffic: the tab asks for the admin token first.
    await page.locator("#workload-stats .needs-admin").wait_for()
    await page.click("#tab-keys")
    await page.fill("#admin-token", ADMIN_TOKEN)
    await page.click("#admin-save")
    await page.locator("#create-key-form").wait_for()
    await page.click("#tab-workload")
    await page.locator('#wl-ranking .bar-row[data-label="beta-model"]').wait_for()
    assert await page.get_attribute("#view-workload", "data-window") == "day"
    bars = await page.locator("#wl-ranking .bar-row").evaluate_all("rows => rows.map(r => r.dataset.label)")
    assert bars.index("beta-model") < bars.index("alpha-model")  # 6,000 tokens before 2,000
    burst = page.locator('#wl-burst .bar-row[data-label="alpha-model"] .bar-value')
    assert (await burst.text_content() or "").strip() == "5.5\u00d7"
    reuse = page.locator('#wl-reuse .bar-row[data-label="alpha-model"] .bar-value')
    assert (await reuse.text_content() or "").strip() == "51%"  # 19 x 32 of 20 x 60 prompt tokens
    for chart in ("#wl-tpm", "#wl-input-cdf", "#wl-output-cdf", "#wl-ratio"):
        assert await page.locator(f"{chart} polyline").count() >= 1, chart
    reasoning = await page.locator('#wl-latency tr[data-kind="reasoning"]').inner_text()
    assert "10.00 s" in reasoning and "200" in reasoning
    assert "alpha-model" in await page.locator("#wl-lengths").inner_text()
    if device == "phone":
        assert await page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth")
    await _snap(page, shots, f"{device}-workload")
    # The last hour has only alpha-model's requests.
    await page.select_option("#workload-window", "hour")
    await page.wait_for_function("() => document.querySelector('#view-workload').dataset.window === 'hour'")
    assert await page.locator('#wl-ranking .bar-row[data-label="beta-model"]').count() == 0
    assert await page.locator('#wl-ranking .bar-row[data-label="alpha-model"]').count() == 1
    assert await page.evaluate("window.__csp") == []
    await page.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def alias_site(mesh: LocalMesh, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Frontend]:
    """A frontend in front of a second ingress (no engine) given an alias and a default model by flags. Only the last
    test asks for it, so the node map above never sees this ingress."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    node = await mesh.add_worker(
        "dash-alias-ingress",
        None,
        *("--role", "ingress", "--http", f"127.0.0.1:{port}"),
        *("--model-alias", f"smol={MODEL_ID}", "--default-model", "smol"),
    )

    async def sees_alias() -> bool:
        try:
            async with mesh.http().get(url + "/v1/models") as r:
                data = (await r.json())["data"] if r.status == 200 else []
        except aiohttp.ClientError:
            return False
        return any(m["id"] == "smol" and len(m["replicas"]) >= 2 for m in data)

    fe = None
    try:
        await mesh.wait_for(sees_alias, timeout=60, what="the alias ingress to list smol")
        fe = await start_frontend(url, f"sqlite:///{tmp_path_factory.mktemp('dash-alias') / 'frontend.db'}")
        yield fe
    finally:
        if fe is not None:
            await fe.aclose()
        await node.stop()
        mesh.nodes.pop("dash-alias-ingress", None)


async def test_an_alias_shows_on_its_targets_card(alias_site: Frontend, browser) -> None:
    _, secret = await alias_site.state.keys.create(KeySettings(name="alias-viewer"))
    page = await browser.new_page(viewport=LAPTOP)
    await page.goto(alias_site.url + "/")
    await page.fill("#key-input", secret)
    await page.click("#key-save")
    card = page.locator(f'.model-card[data-model="{MODEL_ID}"]')
    await card.locator(".aliases").wait_for()
    assert (await card.locator(".aliases").inner_text()).strip() == "also: smol (default)"
    # The alias's copy of the replicas is not counted again.
    assert "2 of 2 replicas healthy" in await card.inner_text()
    assert await page.locator(".model-card").count() == 1  # no card of its own
    assert await page.locator(".model-card .replica").count() == 2
    assert (await page.locator("#models-summary").inner_text()).startswith("1 model served, 1 alias")
    # The playground offers the alias by name, chosen as the ingress's default.
    await page.click("#tab-playground")
    options = await page.locator("#chat-model option").evaluate_all(
        "opts => opts.map(o => [o.value, o.textContent])"
    )
    assert options == [[MODEL_ID, MODEL_ID], ["smol", f"smol \u2192 {MODEL_ID}"]]
    assert await page.locator("#chat-model").input_value() == "smol"
    await page.close()
