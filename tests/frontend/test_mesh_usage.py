"""Through a real mesh with the embedded engine: usage rows for plain and streamed requests, keys and limits over
HTTP, and bad input that never reaches an engine; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, start_frontend
from openai import AsyncOpenAI
from sqlalchemy import select

from opentela.bench.traces import CSV_COLUMNS
from opentela.cli.localmesh import LocalMesh
from opentela.engines.embedded import MODEL_ID
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

PROVIDERS = {"demo-provider-1", "demo-provider-2"}
CHAT = {
    "model": MODEL_ID,
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 8,
    "temperature": 0,
}


@pytest_asyncio.fixture(loop_scope="session")
async def frontend(mesh: LocalMesh, db_url: str) -> AsyncIterator[Frontend]:
    """A frontend on the given database in front of the session's mesh, with a small body limit."""
    fe = await start_frontend(mesh.api, db_url, max_body_bytes=32 * 1024)
    try:
        yield fe
    finally:
        await fe.aclose()


async def _key(fe: Frontend, **settings) -> str:
    _, secret = await fe.state.keys.create(KeySettings(**settings))
    return secret


async def _row(fe: Frontend, row_id: str) -> UsageRow:
    async with fe.state.db.session() as s:
        row = await s.get(UsageRow, row_id)
    assert row is not None, f"no usage row {row_id}"
    return row


async def _ingress_requests(mesh: LocalMesh) -> float:
    """Requests the ingress has seen, from its Prometheus counter."""
    async with mesh.http().get(mesh.api.removesuffix("/v1") + "/metrics") as r:
        text = await r.text()
    return sum(float(m) for m in re.findall(r"^otela_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


async def test_plain_request_gets_a_complete_usage_row(frontend: Frontend) -> None:
    secret = await _key(frontend, name="plain")
    client = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(**CHAT)
    reply = raw.parse()
    assert reply.choices[0].message.content
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert row.status == "ok" and row.http_status == 200 and not row.stream
    assert (row.input_tokens, row.output_tokens) == (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert not row.tokens_estimated  # the engine reported its own counts
    assert row.provider in PROVIDERS and row.node == raw.headers["x-otela-node"]
    assert row.latency_ms > 0 and row.request_id == raw.headers["x-otela-request-id"]
    assert row.sampling == {"max_tokens": 8, "temperature": 0}
    await client.close()


async def test_stream_usage_comes_from_the_final_chunk(frontend: Frontend) -> None:
    secret = await _key(frontend, name="stream")
    client = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    # The client did not ask for usage: the frontend asks the engine for it and keeps the extra chunk to itself.
    raw = await client.chat.completions.with_raw_response.create(**CHAT, stream=True)
    chunks = [c async for c in raw.parse()]
    assert chunks and all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert text and row.status == "ok" and row.stream and not row.tokens_estimated
    assert 0 < row.output_tokens <= 8 and row.input_tokens > 0
    assert row.ttft_ms is not None and 0 < row.ttft_ms <= row.latency_ms
    # A client that asks for usage gets the same numbers the row holds.
    raw = await client.chat.completions.with_raw_response.create(
        **CHAT, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in raw.parse()]
    usage = chunks[-1].usage
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert usage is not None and (row.input_tokens, row.output_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    await client.close()


async def test_completions_and_models(frontend: Frontend) -> None:
    secret = await _key(frontend, allowed_models=[MODEL_ID])
    client = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    done = await client.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=4)
    assert done.usage.completion_tokens > 0
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert {r["provider_id"] for r in models.data[0].model_extra["replicas"]} == PROVIDERS
    narrow = await _key(frontend, trusted_providers=["demo-provider-2"])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {narrow}"}) as http:
        async with http.get(frontend.url + "/v1/models") as r:
            listing = await r.json()
    assert {r["provider_id"] for r in listing["data"][0]["replicas"]} == {"demo-provider-2"}
    # The demo's engines serve chat only: their 501 for embeddings reaches the client, and the row says so.
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        async with http.post(frontend.url + "/v1/embeddings", json={"model": MODEL_ID, "input": "hi"}) as r:
            assert r.status == 501 and "error" in await r.json()
            row = await _row(frontend, r.headers["X-Otela-Usage-Row"])
    assert (row.status, row.http_status, row.endpoint) == ("error", 501, "/v1/embeddings")
    await client.close()


async def test_admin_api_keys_lifecycle_and_export(frontend: Frontend) -> None:
    url = frontend.url
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/admin/keys", json={"name": "carol"}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "admin_token_required"
        async with http.post(url + "/admin/keys", json={"name": "carol", "rpm": 3}, headers=admin) as r:
            assert r.status == 400 and "rpm" in (await r.json())["error"]["message"]
        async with http.post(
            url + "/admin/keys", json={"name": "carol", "budget_period": "year"}, headers=admin
        ) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "budget_period"
        async with http.post(
            url + "/admin/keys", json={"name": "carol", "rpm_limit": 30}, headers=admin
        ) as r:
            assert r.status == 201
            made = await r.json()
        secret, key_id = made["secret"], made["key"]["id"]
        user = {"Authorization": f"Bearer {secret}"}
        async with http.post(url + "/v1/chat/completions", json=CHAT, headers=user) as r:
            assert r.status == 200
            assert (r.headers["x-ratelimit-limit-requests"], r.headers["x-ratelimit-remaining-requests"]) == (
                "30",
                "29",
            )
        async with http.get(url + "/v1/usage", headers=user) as r:
            mine = await r.json()
        assert mine["key"]["name"] == "carol" and sum(a["requests"] for a in mine["aggregates"]) == 1
        async with http.get(url + "/admin/keys", headers=admin) as r:
            listing = await r.json()
        assert secret not in json.dumps(listing) and key_id in {k["id"] for k in listing["data"]}
        async with http.post(url + f"/admin/keys/{key_id}/rotate", headers=admin) as r:
            rotated = (await r.json())["secret"]
        async with http.post(url + "/v1/chat/completions", json=CHAT, headers=user) as r:
            assert r.status == 401
        user = {"Authorization": f"Bearer {rotated}"}
        async with http.post(url + f"/admin/keys/{key_id}/revoke", headers=admin) as r:
            assert (await r.json())["state"] == "revoked"
        async with http.post(url + "/v1/chat/completions", json=CHAT, headers=user) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "api_key_revoked"
        async with http.get(url + "/admin/usage/export.csv", headers=admin) as r:
            lines = (await r.text()).splitlines()
        assert lines[0] == ",".join(CSV_COLUMNS)
        assert any(MODEL_ID in ln for ln in lines[1:])
        async with http.get(url + "/docs") as r:
            assert r.status == 200
        async with http.get(url + "/openapi.json") as r:
            paths = (await r.json())["paths"]
        assert {"/v1/chat/completions", "/v1/models", "/admin/keys"} <= set(paths)


async def test_bad_input_gets_clear_errors_and_never_reaches_an_engine(
    frontend: Frontend, mesh: LocalMesh
) -> None:
    ok = await _key(frontend, name="ok", allowed_models=[MODEL_ID])
    revoked = await _key(frontend, name="revoked")
    await frontend.state.keys.revoke((await frontend.state.keys.authenticate(revoked)).id)
    expired = await _key(frontend, expires_at=time.time() - 5)
    spent = await _key(frontend, budget_requests=0)
    slow = await _key(frontend, rpm_limit=0)
    before = await _ingress_requests(mesh)
    async with frontend.state.db.session() as s:
        rows_before = len((await s.scalars(select(UsageRow.id))).all())
    url = frontend.url + "/v1/chat/completions"
    cases = [
        ({}, json.dumps(CHAT), 401, "invalid_api_key"),
        ({"Authorization": "Bearer otela-made-up"}, json.dumps(CHAT), 401, "invalid_api_key"),
        ({"Authorization": "Bearer sk-openai-style"}, json.dumps(CHAT), 401, "invalid_api_key"),
        ({"Authorization": f"Bearer {revoked}"}, json.dumps(CHAT), 401, "api_key_revoked"),
        ({"Authorization": f"Bearer {expired}"}, json.dumps(CHAT), 401, "api_key_expired"),
        ({"Authorization": f"Bearer {spent}"}, json.dumps(CHAT), 402, "budget_exceeded"),
        ({"Authorization": f"Bearer {slow}"}, json.dumps(CHAT), 429, "rate_limit_exceeded"),
        ({"Authorization": f"Bearer {ok}"}, "{not json", 400, "invalid_request"),
        ({"Authorization": f"Bearer {ok}"}, json.dumps({"model": MODEL_ID}), 400, "invalid_request"),
        ({"Authorization": f"Bearer {ok}"}, json.dumps({**CHAT, "max_tokens": -1}), 400, "invalid_request"),
        ({"Authorization": f"Bearer {ok}"}, json.dumps({**CHAT, "model": "gpt-4"}), 403, "model_not_allowed"),
        (
            {"Authorization": f"Bearer {ok}"},
            json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 40_000}]}),
            413,
            "request_too_large",
        ),
    ]
    async with aiohttp.ClientSession() as http:
        for headers, body, status, code in cases:
            async with http.post(
                url, data=body, headers={"Content-Type": "application/json", **headers}
            ) as r:
                payload = await r.json()
                assert (r.status, payload["error"]["code"]) == (status, code), payload
                assert payload["error"]["message"] and r.headers["X-Otela-Request-Id"]
                if status == 429:
                    assert (
                        int(r.headers["Retry-After"]) >= 1
                        and payload["error"]["limit"] == "requests_per_minute"
                    )
                if status == 402:
                    assert (
                        payload["error"]["limit"] == "budget_requests"
                        and payload["error"]["resets_at"] > time.time()
                    )
        async with http.get(frontend.url + "/v1/models") as r:
            assert r.status == 401
        async with http.post(frontend.url + "/v1/nothing-here", json=CHAT) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    assert await _ingress_requests(mesh) == before
    async with frontend.state.db.session() as s:
        assert len((await s.scalars(select(UsageRow.id))).all()) == rows_before


async def test_key_trust_allowlist_routes_only_to_trusted_providers(frontend: Frontend) -> None:
    secret = await _key(frontend, trusted_providers=["demo-provider-2"])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        for _ in range(4):
            async with http.post(frontend.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2}) as r:
                assert r.status == 200 and r.headers["X-Otela-Provider"] == "demo-provider-2"
