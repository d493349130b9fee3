"""CORS at the frontend, on a real socket over SQLite: every origin by default (keys travel in the Authorization
header), preflights from an origin a list leaves out refused, and the headers on a success, an error and a stream;
the dashboard's own paths never take part.

A stand-in ingress answers chat requests whole or as an event stream, with the gateway's routing headers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from frontend_helpers import start_frontend

from loopback_http import serve_app
from opentela import cors
from opentela.errors import ConfigError
from opentela.frontend import Frontend
from opentela.frontend._config import FrontendConfig
from opentela.frontend.keys import KeySettings

APP = "https://app.example.org"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang",
}


@pytest_asyncio.fixture
async def ingress() -> AsyncIterator[str]:
    """Answers chat requests with the gateway's routing headers, streamed when asked."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {"X-Otela-Node": "12D3KooWstandin", "X-Otela-Model": "m"}
        if not body.get("stream"):
            reply = {
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
            return web.json_response(reply, headers=headers)
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serve_app(app) as url:
        yield url


async def _started(ingress: str, tmp_path: Path, **config: object) -> Frontend:
    return await start_frontend(ingress, f"sqlite:///{tmp_path / 'f.db'}", **config)


async def _key(frontend: Frontend) -> dict[str, str]:
    _, secret = await frontend.state.keys.create(KeySettings(name="cors"))
    return {"Authorization": f"Bearer {secret}"}


def _cors_names(headers: object) -> set[str]:
    return {k.lower() for k in headers if k.lower().startswith("access-control-")}  # type: ignore[attr-defined]


async def test_by_default_every_origin_may_call_the_api(ingress: str, tmp_path: Path) -> None:
    frontend = await _started(ingress, tmp_path)
    try:
        key = await _key(frontend)
        async with aiohttp.ClientSession() as http:
            async with http.options(frontend.url + "/v1/chat/completions", headers=PREFLIGHT) as r:
                assert r.status == 204 and await r.read() == b""
                assert r.headers["Access-Control-Allow-Origin"] == "*"
                assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
                assert (
                    r.headers["Access-Control-Allow-Headers"] == PREFLIGHT["Access-Control-Request-Headers"]
                )
                assert r.headers["Access-Control-Max-Age"] == "600"
                assert "Access-Control-Allow-Credentials" not in r.headers
            origin = {"Origin": APP}
            for body, headers, status in (
                (CHAT, key, 200),
                ({**CHAT, "stream": True}, key, 200),
                (CHAT, {}, 401),  # an error answer
            ):
                async with http.post(
                    frontend.url + "/v1/chat/completions", json=body, headers={**headers, **origin}
                ) as r:
                    payload = await r.read()
                    assert r.status == status, payload
                    assert r.headers["Access-Control-Allow-Origin"] == "*"
                    exposed = {
                        h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")
                    }
                    assert {"x-request-id", "x-otela-request-id", "x-otela-model", "x-otela-node"} <= exposed
                    assert "retry-after" in exposed
                    assert "Access-Control-Allow-Credentials" not in r.headers
                    if body.get("stream"):
                        assert r.headers["Content-Type"].startswith("text/event-stream")
                        assert payload.rstrip().endswith(b"data: [DONE]")
            # Without an Origin, and outside /v1, nothing changes.
            async with http.post(frontend.url + "/v1/chat/completions", json=CHAT, headers=key) as r:
                assert r.status == 200 and not _cors_names(r.headers)
            async with http.options(frontend.url + "/v1/chat/completions") as r:
                assert r.status == 405 and r.headers["Allow"] == "POST"
            async with http.get(frontend.url + "/api/info", headers=origin) as r:
                assert r.status == 200 and not _cors_names(r.headers)
            async with http.options(frontend.url + "/api/me", headers=PREFLIGHT) as r:
                assert r.status == 405 and not _cors_names(r.headers)
    finally:
        await frontend.aclose()


async def test_a_list_answers_its_origins_only(ingress: str, tmp_path: Path) -> None:
    frontend = await _started(ingress, tmp_path, cors_origins=(APP,))
    try:
        key = await _key(frontend)
        async with aiohttp.ClientSession() as http:
            async with http.options(frontend.url + "/v1/models", headers=PREFLIGHT) as r:
                assert r.status == 204
                assert (r.headers["Access-Control-Allow-Origin"], r.headers["Vary"]) == (APP, "Origin")
            evil = {**PREFLIGHT, "Origin": "https://evil.example.com"}
            async with http.options(frontend.url + "/v1/chat/completions", headers=evil) as r:
                assert r.status == 403 and not _cors_names(r.headers)
                error = (await r.json())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["code"] == "origin_not_allowed" and r.headers["X-Otela-Request-Id"]
            for origin, wanted in ((APP, APP), ("https://evil.example.com", None)):
                async with http.post(
                    frontend.url + "/v1/chat/completions", json=CHAT, headers={**key, "Origin": origin}
                ) as r:
                    assert r.status == 200
                    assert r.headers.get("Access-Control-Allow-Origin") == wanted
    finally:
        await frontend.aclose()


async def test_an_empty_list_turns_cors_off(ingress: str, tmp_path: Path) -> None:
    frontend = await _started(ingress, tmp_path, cors_origins=())
    try:
        async with aiohttp.ClientSession() as http:
            async with http.options(frontend.url + "/v1/chat/completions", headers=PREFLIGHT) as r:
                assert r.status == 405 and r.headers["Allow"] == "POST" and not _cors_names(r.headers)
    finally:
        await frontend.aclose()


def test_a_malformed_origin_is_refused_by_name() -> None:
    assert FrontendConfig().cors_origins == ("*",)
    with pytest.raises(ConfigError, match=r"frontend.cors_origins.*'https://app.example.org/v1'"):
        FrontendConfig(cors_origins=("https://app.example.org/v1",))
    assert cors.parse_origins(["https://App.Example.org:8443", "*"], "x") == (
        "https://app.example.org:8443",
        "*",
    )
