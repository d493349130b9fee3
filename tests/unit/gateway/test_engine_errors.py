"""Clients get OpenAI's error shape whatever the engine says, and the ingress refuses what OpenAI refuses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from meshkit import MODEL, chat, gateway_kit, record

from scripted_engine import LLAMA_CONTEXT_ERROR


@asynccontextmanager
async def engine(status: int, body: bytes, content_type: str) -> AsyncIterator[tuple[str, list[int]]]:
    """An engine that answers every completion with `status` and `body`; yields its URL and a request count."""
    seen: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(1)
        await request.read()
        return web.Response(status=status, body=body, content_type=content_type)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_an_engines_own_error_json_reaches_the_client_in_openai_shape() -> None:
    async with (
        gateway_kit() as kit,
        engine(400, json.dumps(LLAMA_CONTEXT_ERROR).encode(), "application/json") as (url, _),
    ):
        kit.mesh.add(record("a"), url)
        status, headers, raw = await kit.post(chat(), {"X-Request-Id": "ctx-1"})
        assert status == 400 and headers["Content-Type"].startswith("application/json")
        assert headers["X-Request-Id"] == headers["X-Otela-Request-Id"] == "ctx-1"
        err = json.loads(raw)["error"]
        assert (err["type"], err["code"], err["param"]) == (
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        )
        assert "exceeds the available context size" in err["message"]


async def test_a_plain_text_engine_failure_becomes_an_error_object() -> None:
    async with gateway_kit() as kit, engine(500, b"segfault in sampler\n", "text/plain") as (url, _):
        kit.mesh.add(record("a"), url)
        status, headers, raw = await kit.post(chat())
        assert status == 500 and headers["Content-Type"].startswith("application/json")
        assert json.loads(raw) == {
            "error": {"message": "segfault in sampler", "type": "server_error", "param": None, "code": None}
        }


async def test_fields_openai_refuses_are_refused_before_any_engine_sees_them() -> None:
    async with gateway_kit() as kit, engine(200, b"{}", "application/json") as (url, seen):
        kit.mesh.add(record("a"), url)
        bad = [
            (chat(tools="x"), "tools"),
            ({"model": MODEL, "messages": [{"content": "no role"}]}, "messages[0].role"),
            ({"model": MODEL, "messages": []}, "messages"),
            (chat(max_tokens=0), "max_tokens"),
            (chat(max_completion_tokens=-1), "max_completion_tokens"),
            (chat(temperature=5), "temperature"),
            (chat(tool_choice="required"), "tool_choice"),
        ]
        for body, param in bad:
            status, _, raw = await kit.post(body)
            err = json.loads(raw)["error"]
            assert (status, err["type"], err["param"]) == (400, "invalid_request_error", param), body
        status, _, raw = await kit.post(chat(), path="/v1/chat/completions")
        assert status == 200
        assert len(seen) == 1  # only the good request was forwarded


async def test_non_finite_numbers_are_refused_with_the_reason() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        assert kit.http is not None
        raw_body = (
            b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "top_p": 1e999}'
            % MODEL.encode()
        )
        async with kit.http.post(
            kit.url + "/v1/chat/completions", data=raw_body, headers={"Content-Type": "application/json"}
        ) as resp:
            err = (await resp.json())["error"]
            assert resp.status == 400 and "out of range" in err["message"]
        assert kit.requests_seen("a") == 0


async def test_route_errors_say_what_would_work() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        assert kit.http is not None
        async with kit.http.get(kit.url + "/v1/chat/completions") as resp:
            assert resp.status == 405 and "POST" in resp.headers["Allow"]
            assert (await resp.json())["error"]["code"] == "method_not_allowed"
        async with kit.http.post(kit.url + "/v1/chat/complete", json=chat()) as resp:
            assert resp.status == 404 and "/v1/responses" in (await resp.json())["error"]["message"]


async def test_a_responses_request_over_the_output_cap_names_its_own_field() -> None:
    async with gateway_kit(max_tokens_caps=(f"{MODEL}=64",)) as kit:
        await kit.replica("a")
        body = {"model": MODEL, "input": "hello", "max_output_tokens": 10**9}
        status, _, raw = await kit.post(body, path="/v1/responses")
        err = json.loads(raw)["error"]
        assert status == 400 and err["param"] == "max_output_tokens" and "max_output_tokens" in err["message"]
