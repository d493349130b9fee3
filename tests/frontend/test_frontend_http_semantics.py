"""HTTP semantics of the frontend that clients and proxies rely on: Allow on 405, a Bearer challenge on 401, HEAD
wherever GET is served, trailing slashes served (never a POST redirect), compressed request bodies, the ingress's
Retry-After passed on, and numbers JSON cannot carry refused at the door and never breaking a listing.

A stand-in ingress (a small aiohttp app answering like the gateway, its errors rendered by the same OpenAI edge)
records what the frontend forwards; the frontend is the real one on a real socket, over SQLite.
"""

from __future__ import annotations

import gzip
import json
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
from aiohttp import web
from frontend_helpers import ADMIN_TOKEN, start_frontend
from sqlalchemy import insert

from loopback_http import serve_app
from opentela import openai_edge as edge
from opentela.errors import NoTrustedProviderError
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow
from opentela.frontend.usage import utc_day

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LIMIT = 64 * 1024
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest_asyncio.fixture
async def ingress() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in ingress: records each forwarded body; model `busy` gets the gateway's 503 no_trusted_provider."""
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if body.get("model") == "busy":
            err = NoTrustedProviderError("no replica of busy runs at a trusted provider", retry_after=7.0)
            status, headers, payload = edge.render_error(err, request.headers.get("X-Request-Id"))
            return web.Response(
                body=payload, status=status, headers=headers, content_type=edge.JSON_CONTENT_TYPE
            )
        reply = {
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        if body.get("model") == "multi" and body.get("stream"):  # the same, streamed: 2 chunks per choice
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for k in range(2):
                for i in range(3):
                    delta = {"choices": [{"index": i, "delta": {"content": f"w{k}"}}]}
                    await resp.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        if body.get("model") == "multi":  # llama.cpp's way with n > 1: usage counts one choice
            text = "forty characters of generated text here."
            reply = {
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": text}} for i in range(3)
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 10},
            }
        return web.json_response(
            reply, headers={"X-Otela-Provider": "lab-a", "X-Otela-Node": "12D3KooWstandin"}
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "replicas": []}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    async with serve_app(app) as url:
        yield url, seen


@pytest_asyncio.fixture
async def frontend(ingress: tuple[str, list], tmp_path: Path) -> AsyncIterator[Frontend]:
    fe = await start_frontend(ingress[0], f"sqlite:///{tmp_path / 'f.db'}", max_body_bytes=LIMIT)
    try:
        yield fe
    finally:
        await fe.aclose()


async def _key(frontend: Frontend) -> dict[str, str]:
    _, secret = await frontend.state.keys.create(KeySettings(name="http", log_content=True))
    return {"Authorization": f"Bearer {secret}"}


def _openai_error(payload: dict[str, Any]) -> dict[str, Any]:
    assert set(payload) == {"error"}
    assert {"message", "type", "param", "code"} <= set(payload["error"])
    return payload["error"]


async def test_405_names_every_allowed_method(frontend: Frontend) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path, allowed in (
            ("GET", "/v1/chat/completions", "POST"),
            ("DELETE", "/v1/models", "GET, HEAD"),
            ("PUT", "/admin/keys", "GET, HEAD, POST"),  # two routes share the path
        ):
            async with http.request(method, frontend.url + path, headers=ADMIN) as r:
                assert r.status == 405, (method, path)
                assert r.headers["Allow"] == allowed
                assert _openai_error(await r.json())["code"] == "method_not_allowed"


async def test_401_carries_a_bearer_challenge(frontend: Frontend) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path, headers in (
            ("GET", "/v1/models", {}),
            ("POST", "/v1/chat/completions", {"Authorization": "Bearer otela-not-a-key"}),
            ("GET", "/admin/keys", {"Authorization": "Bearer otela-admin-wrong"}),
        ):
            async with http.request(method, frontend.url + path, json=CHAT, headers=headers) as r:
                assert r.status == 401, path
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert _openai_error(await r.json())["type"] == "authentication_error"


async def test_head_is_answered_wherever_get_is(frontend: Frontend) -> None:
    key = await _key(frontend)
    async with aiohttp.ClientSession() as http:
        async with http.get(frontend.url + "/v1/models", headers=key) as r:
            get_length = r.headers["Content-Length"]
        for path, headers, status in (
            ("/v1/models", key, 200),
            ("/api/info", {}, 200),
            ("/", {}, 200),
            ("/v1/models", {}, 401),
        ):
            async with http.head(frontend.url + path, headers=headers) as r:
                assert r.status == status, path
                assert await r.read() == b""
                if path == "/v1/models" and status == 200:
                    assert r.headers["Content-Type"] == "application/json"
                    assert r.headers["Content-Length"] == get_length
        async with http.head(frontend.url + "/v1/chat/completions", headers=key) as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"


async def test_a_trailing_slash_is_served_not_redirected(
    frontend: Frontend, ingress: tuple[str, list]
) -> None:
    key = await _key(frontend)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            frontend.url + "/v1/chat/completions/", json=CHAT, headers=key, allow_redirects=False
        ) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["choices"][0]["message"]["content"] == "ok"
        async with http.get(frontend.url + "/v1/models/", headers=key, allow_redirects=False) as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == ["m"]
    assert len(ingress[1]) == 1


async def test_compressed_bodies_are_decoded_within_the_size_limit(
    frontend: Frontend, ingress: tuple[str, list]
) -> None:
    key = await _key(frontend)
    raw = json.dumps(CHAT).encode()
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    encoded = {
        "gzip": gzip.compress(raw),
        "deflate": zlib.compress(raw),
        "Deflate": raw_deflate.compress(raw) + raw_deflate.flush(),  # raw deflate, as some clients send it
        "identity": raw,
    }
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        for coding, data in encoded.items():
            headers = {**key, "Content-Type": "application/json", "Content-Encoding": coding}
            async with http.post(frontend.url + "/v1/chat/completions", data=data, headers=headers) as r:
                assert r.status == 200, (coding, await r.text())
        assert ingress[1] == [CHAT] * len(encoded)

        # A zip bomb: a few hundred bytes that inflate past the limit are refused on their decompressed size.
        bomb = gzip.compress(raw[:-1] + b', "user": "' + b"a" * (LIMIT * 16) + b'"}')
        assert len(bomb) < LIMIT // 10
        for coding, data, status, code in (
            ("gzip", bomb, 413, "request_too_large"),
            ("gzip", gzip.compress(raw)[:-8], 400, "invalid_request"),
            ("br", raw, 415, "unsupported_content_encoding"),
        ):
            headers = {**key, "Content-Type": "application/json", "Content-Encoding": coding}
            async with http.post(frontend.url + "/v1/chat/completions", data=data, headers=headers) as r:
                assert r.status == status, (coding, await r.text())
                err = _openai_error(await r.json())
                assert err["code"] == code and err["type"] == "invalid_request_error"
                if status == 415:
                    assert r.headers["Accept-Encoding"] == "gzip, deflate, identity"
    assert len(ingress[1]) == len(encoded)  # nothing refused was forwarded


async def test_the_ingress_retry_after_reaches_the_client(frontend: Frontend) -> None:
    key = await _key(frontend)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            frontend.url + "/v1/chat/completions",
            json={**CHAT, "model": "busy"},
            headers={**key, "X-Request-Id": "req-busy-1"},
        ) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "7"
            assert r.headers["X-Otela-Request-Id"] == "req-busy-1"
            assert "X-Otela-Usage-Row" in r.headers
            assert _openai_error(await r.json())["code"] == "no_trusted_provider"


async def test_non_finite_numbers_are_refused_before_forwarding(
    frontend: Frontend, ingress: tuple[str, list]
) -> None:
    key = await _key(frontend)
    raw_chat = json.dumps(CHAT)[:-1]
    async with aiohttp.ClientSession() as http:
        for extra, name, shown in (
            ('"top_p": 1e999', "top_p", "1e999"),
            ('"temperature": NaN', "temperature", "NaN"),
            ('"logit_bias": {"50256": -Infinity}', "logit_bias.50256", "Infinity"),
        ):
            data = f"{raw_chat}, {extra}}}".encode()
            headers = {**key, "Content-Type": "application/json"}
            async with http.post(frontend.url + "/v1/chat/completions", data=data, headers=headers) as r:
                assert r.status == 400, (extra, await r.text())
                err = _openai_error(await r.json())
                assert err["type"] == "invalid_request_error"
                assert name in err["message"] or shown in err["message"], err
    assert ingress[1] == []
    assert await frontend.state.ledger.rows(limit=10) == []  # nothing metered


async def test_listings_render_a_stored_non_finite_value_as_null(frontend: Frontend) -> None:
    key_record, secret = await frontend.state.keys.create(KeySettings(name="odd-row"))
    now = time.time()
    async with frontend.state.db.engine.begin() as conn:
        await conn.execute(
            insert(UsageRow),
            [
                {
                    "id": uuid.uuid4().hex,
                    "request_id": "odd",
                    "key_id": key_record.id,
                    "instance": "older-version",
                    "endpoint": "/v1/chat/completions",
                    "model": "m",
                    "stream": False,
                    "status": "ok",
                    "started_at": now,
                    "finished_at": now + 1,
                    "day": utc_day(now),
                    "input_tokens": 3,
                    "output_tokens": 1,
                    "tokens_estimated": False,
                    "latency_ms": float("inf"),
                    "ttft_ms": float("nan"),
                    "sampling": {"top_p": float("inf"), "temperature": 0.5},
                }
            ],
        )
    async with aiohttp.ClientSession() as http:
        async with http.get(frontend.url + "/v1/usage", headers={"Authorization": f"Bearer {secret}"}) as r:
            assert r.status == 200, await r.text()
            (mine,) = (await r.json())["rows"]
        async with http.get(frontend.url + "/admin/usage/rows?limit=100", headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            (listed,) = [row for row in (await r.json())["data"] if row["request_id"] == "odd"]
    for row in (mine, listed):
        assert row["latency_ms"] is None and row["ttft_ms"] is None
        assert row["sampling"] == {"top_p": None, "temperature": 0.5}


async def test_an_answer_of_several_choices_is_metered_at_least_by_their_text(frontend: Frontend) -> None:
    key = await _key(frontend)
    async with aiohttp.ClientSession() as http:
        body = {**CHAT, "model": "multi", "n": 3}
        async with http.post(frontend.url + "/v1/chat/completions", json=body, headers=key) as r:
            assert r.status == 200 and len((await r.json())["choices"]) == 3
    (row,) = await frontend.state.ledger.rows(limit=10)
    assert row.output_tokens == 30 and row.tokens_estimated  # 3 x 10 estimated tokens, not the 10 reported


async def test_a_stream_of_several_choices_is_metered_at_least_by_its_chunks(frontend: Frontend) -> None:
    key = await _key(frontend)
    async with aiohttp.ClientSession() as http:
        body = {**CHAT, "model": "multi", "n": 3, "stream": True}
        async with http.post(frontend.url + "/v1/chat/completions", json=body, headers=key) as r:
            assert r.status == 200 and b"[DONE]" in await r.read()
    (row,) = await frontend.state.ledger.rows(limit=10)
    assert (
        row.output_tokens == 6 and row.tokens_estimated
    )  # six chunks over three choices, not the 2 reported
