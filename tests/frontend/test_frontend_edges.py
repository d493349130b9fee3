"""HTTP edges of a real `otela frontend` process: connection deadlines, hostile JSON, admin input checked before
any write, listings that survive odd stored rows, private database files, the mesh views behind a credential,
security headers, and no echo of a presented key."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, FrontendProcess
from frontend_services import CHROMIUM_FLAGS

from opentela.cli.localmesh import LocalMesh
from slow_clients import idle_client, slow_header_client

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

HEADER_TIMEOUT = 2.0
KEEPALIVE_TIMEOUT = 4.0
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def ingress(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """An ingress process alone: the frontend's mesh views relay its read-only endpoints."""
    async with LocalMesh(tmp_path_factory.mktemp("edges-ingress")) as mesh:
        await mesh.start_ingress()
        yield mesh


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def site(
    ingress: LocalMesh, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FrontendProcess]:
    """`otela frontend` with short connection deadlines, on a SQLite file created under the usual umask."""
    workdir = tmp_path_factory.mktemp("edges-frontend")
    fe = FrontendProcess(ingress.api, f"sqlite:///{workdir / 'frontend.db'}", workdir, name="edges")
    fe.node.env = {
        **(fe.node.env or {}),
        "OTELA_FRONTEND_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "OTELA_FRONTEND_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT),
    }
    fe.db_path = workdir / "frontend.db"  # type: ignore[attr-defined]
    old = os.umask(0o022)  # under which a file created with the default mode is readable by everyone
    try:
        await fe.start()
    finally:
        os.umask(old)
    try:
        yield fe
    finally:
        await fe.stop()


async def otela_async(*args: str) -> str:
    """`otela ...` run to completion without blocking the loop; its standard output (exit status 0)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opentela",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def _create_key(http: aiohttp.ClientSession, url: str, **settings: object) -> dict:
    async with http.post(url + "/admin/keys", json={"name": "edges", **settings}, headers=ADMIN) as r:
        assert r.status == 201, await r.text()
        return await r.json()


async def test_a_slow_header_flood_is_cut_off(site: FrontendProcess) -> None:
    flood = [asyncio.create_task(slow_header_client(site.port, 1.0, 30)) for _ in range(100)]
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as http, http.get(site.url + "/api/info") as r:
        assert r.status == 200
    closed = await asyncio.gather(*flood)
    assert all(t is not None for t in closed), f"{closed.count(None)} of 100 slow connections never closed"
    assert max(t for t in closed if t is not None) < HEADER_TIMEOUT + 4


async def test_idle_connections_are_closed_after_the_keepalive_timeout(site: FrontendProcess) -> None:
    for after_request in (False, True):
        waited = await idle_client(site.port, 30, after_request=after_request)
        assert waited is not None, f"an idle connection was never closed (after a request: {after_request})"
        assert KEEPALIVE_TIMEOUT - 1 < waited < KEEPALIVE_TIMEOUT + 4


async def test_hostile_json_answers_400(site: FrontendProcess) -> None:
    async with aiohttp.ClientSession() as http:
        secret = (await _create_key(http, site.url))["secret"]
        bodies = {
            "/v1/chat/completions": [
                b"[" * 100_000 + b"]" * 100_000,
                b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b', "messages": []}',
            ],
            "/admin/keys": [
                b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"rpm_limit": ' + b"9" * 5000 + b"}",
            ],
        }
        for path, raws in bodies.items():
            auth = ADMIN if path.startswith("/admin") else {"Authorization": f"Bearer {secret}"}
            for raw in raws:
                headers = {**auth, "Content-Type": "application/json"}
                async with http.post(site.url + path, data=raw, headers=headers) as r:
                    payload = await r.json()
                    assert r.status == 400, (path, raw[:40], payload)
                    assert payload["error"]["type"] == "invalid_request_error"


async def test_admin_input_is_checked_before_any_write(site: FrontendProcess) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(site.url + "/admin/keys", headers=ADMIN) as r:
            before = {k["id"] for k in (await r.json())["data"]}
        for raw in (
            b'{"name": "inf", "expires_at": Infinity}',
            b'{"name": "nan", "expires_at": NaN}',
            b'{"name": "neg", "expires_at": -Infinity}',
            b'{"name": "far", "expires_at": 1e300}',
            b'{"name": "days", "expires_in_days": 1e308}',
            b'{"name": "days-inf", "expires_in_days": Infinity}',
        ):
            headers = {**ADMIN, "Content-Type": "application/json"}
            async with http.post(site.url + "/admin/keys", data=raw, headers=headers) as r:
                payload = await r.json()
                assert r.status == 400, (raw, payload)
                assert payload["error"]["type"] == "invalid_request_error"
        async with http.get(site.url + "/admin/keys", headers=ADMIN) as r:
            assert r.status == 200
            assert {k["id"] for k in (await r.json())["data"]} == before  # nothing was written


async def test_listing_renders_a_bad_row_an_older_version_stored(site: FrontendProcess) -> None:
    key_id = uuid.uuid4().hex
    with sqlite3.connect(site.db_path) as conn:  # type: ignore[attr-defined]
        conn.execute(
            "INSERT INTO api_keys (id, name, prefix, secret_hash, created_at, expires_at, last_used_at, "
            "budget_period, allowed_models, log_content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key_id,
                "old",
                "otela-oldrow",
                uuid.uuid4().hex * 2,
                1e9,
                float("inf"),
                float("-inf"),
                "month",
                '"not a list"',
                1,
            ),
        )
    async with aiohttp.ClientSession() as http:
        async with http.get(site.url + "/admin/keys", headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            row = next(k for k in (await r.json())["data"] if k["id"] == key_id)
        assert row["expires_at"] is None and row["last_used_at"] is None and row["allowed_models"] is None
        async with http.get(site.url + f"/admin/keys/{key_id}", headers=ADMIN) as r:
            assert r.status == 200
    listing = json.loads(
        await otela_async("keys", "--frontend", site.url, "--admin-token", ADMIN_TOKEN, "--json", "list")
    )
    assert key_id in {k["id"] for k in listing}
    plain = await otela_async("keys", "--frontend", site.url, "--admin-token", ADMIN_TOKEN, "list")
    assert key_id in plain


async def test_database_files_are_private(site: FrontendProcess) -> None:
    async with aiohttp.ClientSession() as http:
        await _create_key(http, site.url)  # a write: the WAL is in use
    db: Path = site.db_path  # type: ignore[attr-defined]
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    assert all(f.exists() for f in files)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: "0o600" for f in files}


async def test_mesh_views_need_a_key_or_the_admin_token(site: FrontendProcess) -> None:
    async with aiohttp.ClientSession() as http:
        made = await _create_key(http, site.url)
        for view in ("models", "table", "peers", "stats", "health"):
            async with http.get(site.url + f"/api/mesh/{view}") as r:
                assert r.status == 401, view
            async with http.get(
                site.url + f"/api/mesh/{view}", headers={"Authorization": "Bearer otela-not-a-key"}
            ) as r:
                assert r.status == 401, view
            for token in (made["secret"], ADMIN_TOKEN):
                async with http.get(
                    site.url + f"/api/mesh/{view}", headers={"Authorization": f"Bearer {token}"}
                ) as r:
                    assert r.status == 200, (view, await r.text())
        async with http.post(site.url + f"/admin/keys/{made['key']['id']}/revoke", headers=ADMIN) as r:
            assert r.status == 200
        async with http.get(
            site.url + "/api/mesh/table", headers={"Authorization": f"Bearer {made['secret']}"}
        ) as r:
            assert r.status == 401


async def test_security_headers(site: FrontendProcess) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/static/app.js", "/api/info", "/docs"):
            async with http.get(site.url + path) as r:
                assert r.status == 200, path
                assert r.headers["X-Frame-Options"] == "DENY"
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert r.headers["Referrer-Policy"] == "no-referrer"
                csp = r.headers["Content-Security-Policy"]
                assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
                if path != "/docs":
                    assert "script-src 'self';" in csp and "unsafe" not in csp
                else:
                    assert "'sha256-" in csp and "unsafe-inline'; img" in csp  # styles only


async def test_no_part_of_a_presented_key_is_echoed(site: FrontendProcess) -> None:
    presented = "otela-" + "Zq7Xv2Lm9Kp4Rt6Wn8Yb" + uuid.uuid4().hex
    async with aiohttp.ClientSession() as http:
        made = await _create_key(http, site.url)
        async with http.post(site.url + f"/admin/keys/{made['key']['id']}/revoke", headers=ADMIN) as r:
            assert r.status == 200
        answers = []
        for secret in (presented, made["secret"]):
            for path in ("/v1/models", "/v1/me", "/api/mesh/table"):
                async with http.get(site.url + path, headers={"Authorization": f"Bearer {secret}"}) as r:
                    assert r.status == 401
                    answers.append(await r.text())
    log = site.node.log_text()
    for secret in (presented, made["secret"]):
        body = secret.removeprefix("otela-")
        fragments = {body[i : i + 6] for i in range(len(body) - 5)}
        for text in [*answers, log]:
            assert not [f for f in fragments if f in text], "a piece of a presented key was echoed"


async def test_the_dashboard_runs_under_its_content_security_policy(
    site: FrontendProcess, chromium: Path
) -> None:
    playwright = pytest.importorskip("playwright.async_api", reason="playwright is part of the test extras")
    async with aiohttp.ClientSession() as http:
        secret = (await _create_key(http, site.url))["secret"]
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_FLAGS)
        try:
            page = await browser.new_page()
            await page.add_init_script(
                "window.__csp = []; document.addEventListener('securitypolicyviolation', "
                "(e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));"
            )
            await page.goto(site.url + "/")
            await page.locator("#models .needs-key").wait_for()
            await page.fill("#key-input", secret)
            await page.click("#key-save")
            await page.wait_for_function(
                "() => document.querySelector('#health-text').textContent.includes('up')"
            )
            for tab in ("nodes", "playground", "usage"):
                await page.click(f"#tab-{tab}")
                await page.wait_for_timeout(300)
            await page.locator("#usage-chart svg").wait_for()
            await page.click("#tab-keys")
            await page.fill("#admin-token", ADMIN_TOKEN)
            await page.click("#admin-save")
            await page.locator("#create-key-form").wait_for()
            assert await page.evaluate("window.__csp") == []
            await page.goto(site.url + "/docs")
            await page.locator(".swagger-ui .opblock-summary-path").first.wait_for()
            assert await page.evaluate("window.__csp") == []
        finally:
            await browser.close()
