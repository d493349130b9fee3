"""Logging in through a real OpenID Connect provider and managing one's own keys, over HTTP against a running
frontend: who is admitted, the login's checks, group limits, rotation, revocation, other users' keys, logout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, start_frontend
from oidc_kit import (
    CLIENT_ID,
    Provider,
    authorize,
    browser_session,
    log_in,
    oidc_provider,
    origin,
    start_login,
)

from opentela.frontend import Frontend

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NO_INGRESS = "http://127.0.0.1:9"  # nothing here is forwarded


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with oidc_provider() as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def users(provider: Provider) -> None:
    await provider.set_user("alice", email="alice@uni.example", name="Alice", groups=["physics"])
    await provider.set_user("bob", email="bob@uni.example", name="Bob", groups=["chemistry"])
    await provider.set_user("carol", email="carol@partner.example", name="Carol", groups=["physics", "beta"])
    await provider.set_user("mallory", email="mallory@other.example", name="Mallory", groups=["chemistry"])


async def _frontend(provider: Provider, db_url: str) -> Frontend:
    return await start_frontend(
        NO_INGRESS,
        db_url,
        oidc_issuer=provider.url,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret="client-secret",
        oidc_allowed_domains=("uni.example",),
        oidc_allowed_groups=("physics",),
    )


@pytest_asyncio.fixture(loop_scope="session")
async def site(provider: Provider, users: None, tmp_path: Path) -> AsyncIterator[Frontend]:
    fe = await _frontend(provider, f"sqlite:///{tmp_path / 'frontend.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


async def _json(r: aiohttp.ClientResponse) -> Any:
    return await r.json(content_type=None)


async def _logged_in(fe: Frontend, sub: str) -> aiohttp.ClientSession:
    http = browser_session()
    status, where, _ = await log_in(http, fe.url, sub)
    assert (status, where) == (303, "/#keys")
    return http


async def _create(http: aiohttp.ClientSession, fe: Frontend, name: str) -> tuple[int, Any]:
    async with http.post(fe.url + "/api/me/keys", json={"name": name}, headers=origin(fe.url)) as r:
        return r.status, await _json(r)


async def _works(fe: Frontend, secret: str) -> int:
    async with (
        aiohttp.ClientSession() as plain,
        plain.get(fe.url + "/v1/me", headers={"Authorization": f"Bearer {secret}"}) as r,
    ):
        return r.status


async def test_users_of_an_allowed_domain_or_group_log_in_and_others_are_refused(site: Frontend) -> None:
    for sub, groups in (("alice", ["physics"]), ("bob", ["chemistry"]), ("carol", ["physics", "beta"])):
        async with await _logged_in(site, sub) as http, http.get(site.url + "/api/me") as r:
            me = await _json(r)
            assert r.status == 200 and me["user"]["subject"] == sub and me["user"]["groups"] == groups
            assert me["user"]["issuer"] == site.login.oidc.config.oidc_issuer  # type: ignore[union-attr]
    async with browser_session() as http:
        status, page, _ = await log_in(http, site.url, "mallory")
        assert status == 403 and "Access refused" in page and "mallory@other.example" in page
        assert "is in no email domain or group this service admits" in page
        assert "otela_session" not in {c.key for c in http.cookie_jar}
        async with http.get(site.url + "/api/me") as r:
            assert r.status == 401 and (await _json(r))["error"]["code"] == "login_required"
    # Refused accounts leave nothing behind; admitted ones are listed for the administrator.
    async with aiohttp.ClientSession(headers=ADMIN) as admin, admin.get(site.url + "/admin/users") as r:
        assert sorted(u["subject"] for u in (await _json(r))["data"]) == ["alice", "bob", "carol"]


async def test_the_callback_must_answer_the_login_this_browser_started(
    site: Frontend, provider: Provider
) -> None:
    async with browser_session() as http:
        callback = await authorize(http, await start_login(http, site.url), "alice")
        # Another state: a forged or swapped answer.
        async with http.get(callback.replace("state=", "state=x"), allow_redirects=False) as r:
            assert r.status == 400 and "state mismatch" in await r.text()
    async with browser_session() as http, browser_session() as victim:
        # A code obtained in one browser, replayed in another that never started a login (login CSRF).
        callback = await authorize(http, await start_login(http, site.url), "alice")
        async with victim.get(callback, allow_redirects=False) as r:
            assert r.status == 400 and "no login in progress" in await r.text()
        # The provider's refusal reaches the user as such.
        url = await start_login(http, site.url)
        async with http.post(url, data={"action": "deny"}, allow_redirects=False) as r:
            denied = r.headers["Location"]
        async with http.get(denied, allow_redirects=False) as r:
            assert r.status == 400 and "did not log you in" in await r.text()
    async with browser_session() as http:
        # A code used twice is refused by the provider (and the first login's cookie is gone anyway).
        status, _, callback = await log_in(http, site.url, "alice")
        assert status == 303
        async with http.get(callback, allow_redirects=False) as r:
            assert r.status == 400 and "no login in progress" in await r.text()


async def test_own_keys_within_group_limits_rotation_revocation_and_no_one_elses_keys(
    provider: Provider, users: None, db_url: str
) -> None:
    fe = await _frontend(provider, db_url)
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as admin:
            body = {"max_keys": 2, "rpm_limit": 30, "budget_tokens": 5000, "budget_period": "day"}
            async with admin.put(fe.url + "/admin/groups/physics", json=body) as r:
                assert r.status == 200 and (await _json(r))["max_keys"] == 2
            async with admin.put(fe.url + "/admin/groups/*", json={"max_keys": 1}) as r:
                assert r.status == 200
            async with admin.put(fe.url + "/admin/groups/bad", json={"max_keys": -1}) as r:
                assert r.status == 400 and (await _json(r))["error"]["param"] == "max_keys"
            async with admin.put(fe.url + "/admin/groups/bad", json={"budget_period": "year"}) as r:
                assert r.status == 400 and (await _json(r))["error"]["param"] == "budget_period"
            async with admin.get(fe.url + "/admin/groups") as r:
                assert [g["group"] for g in (await _json(r))["data"]] == ["*", "physics"]
        alice, bob = await _logged_in(fe, "alice"), await _logged_in(fe, "bob")
        async with alice, bob:
            async with alice.get(fe.url + "/api/me") as r:
                me = await _json(r)
                assert me["limits"]["group"] == "physics" and me["limits"]["max_keys"] == 2
            status, first = await _create(alice, fe, "laptop")
            assert status == 201 and first["group"] == "physics"
            assert first["key"]["rpm_limit"] == 30 and first["key"]["budget_tokens"] == 5000
            assert first["key"]["budget_period"] == "day"
            assert await _works(fe, first["secret"]) == 200
            status, second = await _create(alice, fe, "cluster")
            assert status == 201
            # One more than the group allows: refused in the API's own error shape, nothing created.
            status, refused = await _create(alice, fe, "third")
            assert status == 403
            assert refused["error"]["code"] == "key_limit_reached"
            assert refused["error"]["type"] == "permission_error"
            assert (
                "2 active keys" in refused["error"]["message"] and "'physics'" in refused["error"]["message"]
            )
            # Bob's groups have no limits of their own: the `*` group's apply.
            status, bobs = await _create(bob, fe, "bob-key")
            assert status == 201 and bobs["group"] == "*"
            assert (await _create(bob, fe, "bob-2"))[0] == 403

            # Rotation: same key, the old secret stops working at once, the new one works.
            key_id = first["key"]["id"]
            async with alice.post(f"{fe.url}/api/me/keys/{key_id}/rotate", headers=origin(fe.url)) as r:
                rotated = await _json(r)
                assert (
                    r.status == 200
                    and rotated["key"]["id"] == key_id
                    and rotated["secret"] != first["secret"]
                )
            assert await _works(fe, first["secret"]) == 401
            assert await _works(fe, rotated["secret"]) == 200

            # Nobody touches another user's keys: they answer as if they did not exist, and stay as they were.
            for action in ("rotate", "revoke"):
                async with bob.post(f"{fe.url}/api/me/keys/{key_id}/{action}", headers=origin(fe.url)) as r:
                    assert r.status == 404 and (await _json(r))["error"]["code"] == "key_not_found"
            async with bob.get(fe.url + "/api/me/keys") as r:
                assert [k["name"] for k in (await _json(r))["data"]] == ["bob-key"]
            assert await _works(fe, rotated["secret"]) == 200

            # Revocation frees a place within the limit.
            async with alice.post(f"{fe.url}/api/me/keys/{key_id}/revoke", headers=origin(fe.url)) as r:
                assert r.status == 200 and (await _json(r))["state"] == "revoked"
            assert await _works(fe, rotated["secret"]) == 401
            async with alice.post(f"{fe.url}/api/me/keys/{key_id}/rotate", headers=origin(fe.url)) as r:
                assert r.status == 401 and (await _json(r))["error"]["code"] == "api_key_revoked"
            assert (await _create(alice, fe, "replacement"))[0] == 201
            async with alice.get(fe.url + "/api/me/keys") as r:
                states = {k["name"]: k["state"] for k in (await _json(r))["data"]}
                assert states == {"laptop": "revoked", "cluster": "active", "replacement": "active"}
            assert second["key"]["owner_id"] == first["key"]["owner_id"] != bobs["key"]["owner_id"]

            # Concurrent creations are counted one at a time: at most the limit gets through.
            async with alice.post(
                f"{fe.url}/api/me/keys/{second['key']['id']}/revoke", headers=origin(fe.url)
            ):
                pass
            results = await asyncio.gather(*(_create(alice, fe, f"burst-{i}") for i in range(6)))
            assert sorted(status for status, _ in results) == [201] + [403] * 5
            async with alice.get(fe.url + "/api/me") as r:
                assert (await _json(r))["active_keys"] == 2

        # The administrator sees every key with its owner, and keeps every power over them.
        async with aiohttp.ClientSession(headers=ADMIN) as admin:
            async with admin.get(fe.url + "/admin/keys") as r:
                assert len((await _json(r))["data"]) == 5  # alice: 4, bob: 1
            async with admin.get(fe.url + "/admin/keys", params={"owner_id": bobs["key"]["owner_id"]}) as r:
                assert [k["name"] for k in (await _json(r))["data"]] == ["bob-key"]
            async with admin.post(f"{fe.url}/admin/keys/{bobs['key']['id']}/revoke") as r:
                assert r.status == 200
            assert await _works(fe, bobs["secret"]) == 401
    finally:
        await fe.aclose()


async def test_self_service_needs_a_session_and_the_dashboards_own_origin(site: Frontend) -> None:
    async with aiohttp.ClientSession() as anonymous:
        for method, path in (("GET", "/api/me"), ("GET", "/api/me/keys"), ("GET", "/api/me/usage")):
            async with anonymous.request(method, site.url + path) as r:
                assert r.status == 401 and (await _json(r))["error"]["code"] == "login_required"
        # An API key or the admin token is no login session.
        async with anonymous.get(site.url + "/api/me", headers=ADMIN) as r:
            assert r.status == 401
    async with await _logged_in(site, "alice") as http:
        for headers in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
            async with http.post(site.url + "/api/me/keys", json={"name": "x"}, headers=headers) as r:
                assert r.status == 403 and (await _json(r))["error"]["code"] == "cross_origin_request"
        async with http.get(site.url + "/api/me/keys") as r:
            assert (await _json(r))["data"] == []
        # The session also opens the mesh views to a logged-in user without a key.
        async with http.get(site.url + "/api/info") as r:
            assert (await _json(r))["login"] is True


async def test_logout_ends_the_session_here_and_sends_the_browser_to_the_provider(
    site: Frontend, provider: Provider
) -> None:
    http = await _logged_in(site, "carol")
    async with http:
        cookie = next(c.value for c in http.cookie_jar if c.key == "otela_session")
        async with http.post(site.url + "/auth/logout", headers={"Origin": "http://evil.example"}) as r:
            assert r.status == 403  # no one else's page logs a user out
        async with http.post(site.url + "/auth/logout", headers=origin(site.url)) as r:
            out = await _json(r)
            assert r.status == 200 and out["logged_out"] is True
            assert out["redirect"].startswith(provider.url + "/oauth2/end_session?")
            assert "id_token_hint=" in out["redirect"] and "post_logout_redirect_uri=" in out["redirect"]
            assert "otela_session" not in {c.key for c in http.cookie_jar}
    async with aiohttp.ClientSession(cookies={"otela_session": cookie}) as old:
        # The old cookie no longer works.
        async with old.get(site.url + "/api/me") as r:
            assert r.status == 401 and (await _json(r))["error"]["code"] == "login_required"


async def test_an_administrator_ends_a_users_sessions(site: Frontend) -> None:
    async with await _logged_in(site, "bob") as http:
        async with http.get(site.url + "/api/me") as r:
            user_id = (await _json(r))["user"]["id"]
        async with aiohttp.ClientSession(headers=ADMIN) as admin:
            async with admin.post(f"{site.url}/admin/users/{user_id}/logout") as r:
                assert (await _json(r))["sessions_ended"] == 1
        async with http.get(site.url + "/api/me") as r:
            assert r.status == 401


async def test_a_frontend_without_a_provider_offers_no_login(tmp_path: Path) -> None:
    fe = await start_frontend(NO_INGRESS, f"sqlite:///{tmp_path / 'f.db'}")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(fe.url + "/api/info") as r:
                assert (await _json(r))["login"] is False
            async with http.get(fe.url + "/auth/login", allow_redirects=False) as r:
                assert r.status == 404 and "not configured" in await r.text()
            # Group limits can be prepared before login is turned on.
            async with http.put(fe.url + "/admin/groups/physics", json={"max_keys": 4}, headers=ADMIN) as r:
                assert r.status == 200
            # The API reference documents the login, the self-service and the group limits.
            async with http.get(fe.url + "/openapi.json") as r:
                paths = set((await _json(r))["paths"])
            assert {
                "/auth/login",
                "/auth/logout",
                "/api/me/keys",
                "/admin/groups/{group}",
                "/admin/users",
            } <= paths
    finally:
        await fe.aclose()
