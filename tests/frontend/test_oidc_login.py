"""Logging in through a real OpenID Connect provider in headless Chromium: make a key in the dashboard, use it with
the official SDK, see its usage, log out; and an account the frontend does not admit is refused with a clear page.

Set OTELA_UPDATE_SCREENSHOTS=1 to refresh the login screenshots in docs/screenshots/ from this run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, start_frontend
from frontend_services import CHROMIUM_FLAGS
from oidc_kit import CLIENT_ID, Provider, oidc_provider
from openai import AsyncOpenAI

from opentela.cli.localmesh import OTELA, LocalMesh, free_port
from opentela.frontend import Frontend

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SIM_MODEL = "login-model"
LAPTOP = {"width": 1366, "height": 800}
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CSP_WATCH = (
    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
    "(e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def sim_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """An ingress and one worker with the simulated engine: the lightest mesh that answers the SDK."""
    async with LocalMesh(tmp_path_factory.mktemp("login-mesh")) as m:
        await m.start_ingress()
        engine = [*OTELA, "engine", "simulated", "--model", SIM_MODEL, "--port", str(free_port())]
        await m.add_worker("worker", [*engine, "--ttft-ms", "20", "--itl-ms", "2"])
        await m.wait_serving(SIM_MODEL, 1, timeout=60)
        yield m


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with oidc_provider() as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def site(sim_mesh: LocalMesh, provider: Provider, tmp_path_factory: pytest.TempPathFactory):
    await provider.set_user("alice", email="alice@uni.example", name="Alice Liddell", groups=["physics"])
    await provider.set_user("mallory", email="mallory@other.example", name="Mallory", groups=["chemistry"])
    fe = await start_frontend(
        sim_mesh.api,
        f"sqlite:///{tmp_path_factory.mktemp('login') / 'frontend.db'}",
        oidc_issuer=provider.url,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret="client-secret",
        oidc_allowed_groups=("physics",),
    )
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        async with admin.put(fe.url + "/admin/groups/physics", json={"max_keys": 2, "rpm_limit": 60}) as r:
            assert r.status == 200
    try:
        yield fe
    finally:
        await fe.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def browser(chromium: Path) -> AsyncIterator[Any]:
    playwright = pytest.importorskip("playwright.async_api", reason="playwright is part of the test extras")
    async with playwright.async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            await b.close()


async def _snap(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    if os.environ.get("OTELA_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / path.name)


async def _loopback_only(route: Any) -> None:
    # The provider's pages link a style sheet from the internet; the tests reach nothing beyond this machine.
    if urlsplit(route.request.url).hostname == "127.0.0.1":
        await route.continue_()
    else:
        await route.abort()


async def _context(browser: Any) -> Any:
    context = await browser.new_context(viewport=LAPTOP)
    await context.route("**/*", _loopback_only)
    await context.add_init_script(CSP_WATCH)
    return context


async def _authorize_as(page: Any, provider: Provider, sub: str) -> dict[str, str]:
    """On the provider's page, log in as `sub`; returns the authorization request's parameters."""
    await page.wait_for_url(provider.url + "/oauth2/authorize**")
    asked = {k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}
    await page.fill("input[name=sub]", sub)
    await page.locator("button[type=submit]", has_text="Authorize").click()
    return asked


async def test_a_user_logs_in_makes_a_key_uses_it_with_the_sdk_and_logs_out(
    site: Frontend, provider: Provider, browser: Any, tmp_path: Path
) -> None:
    context = await _context(browser)
    page = await context.new_page()
    page.on("dialog", lambda d: d.accept())
    await page.goto(site.url + "/#keys")
    await page.locator("#login-panel").wait_for()
    await page.click("#login-link")
    asked = await _authorize_as(page, provider, "alice")
    assert asked["code_challenge_method"] == "S256" and asked["code_challenge"] and asked["nonce"]
    await page.wait_for_url(site.url + "/#keys")
    await page.locator("#self-area").wait_for()
    assert (await page.locator("#account-name").inner_text()) == "Alice Liddell"
    summary = await page.locator("#self-summary").inner_text()
    assert "alice@uni.example" in summary
    assert "0 of 2 keys in use (the limits of group physics); each new key: 60 rpm" in summary
    # The catalog needs no key once logged in.
    await page.click("#tab-models")
    await page.locator(f'.model-card[data-model="{SIM_MODEL}"]').wait_for()

    await page.click("#tab-keys")
    await page.fill("#self-key-name", "sdk")
    await page.click("#self-create")
    secret = (await page.locator("#self-secret .secret-value").inner_text()).strip()
    assert secret.startswith("otela-")
    row = page.locator('.self-key-row[data-name="sdk"]')
    await row.wait_for()
    assert "active" in await row.inner_text() and "60 rpm" in await row.inner_text()
    await _snap(page, tmp_path, "laptop-self-service-keys")

    sdk = AsyncOpenAI(base_url=site.url + "/v1", api_key=secret, max_retries=0)
    try:
        reply = await sdk.chat.completions.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
    finally:
        await sdk.close()
    assert reply.choices[0].message.content and reply.usage is not None
    await page.click("#tab-usage")
    await page.wait_for_function(
        "() => document.querySelectorAll('#usage-rows tbody tr .badge.ok').length === 1"
    )
    assert "your 1 key" in await page.locator("#usage-scope").inner_text()
    assert SIM_MODEL in await page.locator("#usage-rows").inner_text()
    assert int((await page.locator("#usage-stats .stat .v").first.inner_text()).replace(",", "")) == 1

    old = next(c["value"] for c in await context.cookies() if c["name"] == "otela_session")
    session_cookie = next(c for c in await context.cookies() if c["name"] == "otela_session")
    assert session_cookie["httpOnly"] and session_cookie["sameSite"] == "Lax"
    await page.click("#logout-button")
    # The provider's end-session page (RP-initiated logout), which sends the browser back to the dashboard.
    await page.wait_for_url(provider.url + "/oauth2/end_session**")
    await page.locator("button[type=submit]", has_text="End session").click()
    await page.wait_for_url(site.url + "/")
    await page.locator("#login-button").wait_for()
    await page.click("#tab-keys")
    await page.locator("#login-panel").wait_for()
    assert await page.locator("#self-area").is_hidden()
    async with aiohttp.ClientSession(cookies={"otela_session": old}) as http:
        async with http.get(site.url + "/api/me") as r:
            assert r.status == 401  # the old cookie no longer works
    assert await page.evaluate("window.__csp") == []
    await context.close()


async def test_an_account_outside_the_allowed_groups_is_refused_with_a_clear_page(
    site: Frontend, provider: Provider, browser: Any, tmp_path: Path
) -> None:
    context = await _context(browser)
    page = await context.new_page()
    await page.goto(site.url + "/")
    await page.click("#login-button")
    statuses: dict[str, int] = {}
    page.on("response", lambda r: statuses.update({urlsplit(r.url).path: r.status}))
    await _authorize_as(page, provider, "mallory")
    message = page.locator("#auth-message")
    await message.wait_for()
    text = await message.inner_text()
    assert "Access refused" in text and "mallory@other.example" in text and "ask its administrator" in text
    assert statuses["/auth/callback"] == 403
    await _snap(page, tmp_path, "laptop-login-refused")
    assert "otela_session" not in {c["name"] for c in await context.cookies()}
    await page.click("text=Back to the dashboard")
    await page.locator("#login-button").wait_for()
    assert await page.evaluate("window.__csp") == []
    await context.close()
