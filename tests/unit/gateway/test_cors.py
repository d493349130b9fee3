"""CORS at the ingress, over real sockets: preflights answered by aiohttp, the answer headers on what the fast
edge serves (success, error, stream) and on what aiohttp serves after a handover, and nothing at all with the
default configuration."""

from __future__ import annotations

import json

import pytest
from meshkit import MODEL, chat, gateway_kit
from test_fast_edge import exchange, post

from opentela import cors
from opentela.engines.simulated import SimulatedConfig
from opentela.errors import ConfigError
from opentela.gateway._config import GatewayConfig

APP = "https://app.example.org"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}


def _cors_names(headers: dict[str, str]) -> set[str]:
    return {k.lower() for k in headers if k.lower().startswith("access-control-")}


async def test_a_preflight_from_an_allowed_origin_gets_204_and_another_403() -> None:
    async with gateway_kit(cors_origins=(APP,)) as kit:
        assert kit.http is not None
        async with kit.http.options(kit.url + "/v1/chat/completions", headers=PREFLIGHT) as r:
            assert r.status == 204 and await r.read() == b""
            assert r.headers["Access-Control-Allow-Origin"] == APP
            assert r.headers["Vary"] == "Origin"
            assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
            assert r.headers["Access-Control-Allow-Headers"] == PREFLIGHT["Access-Control-Request-Headers"]
            assert r.headers["Access-Control-Max-Age"] == "600"
            assert "Access-Control-Allow-Credentials" not in r.headers
            assert r.headers["X-Otela-Request-Id"]
        # A preflight naming no headers is told the ones the openai SDKs send.
        bare = {"Origin": APP, "Access-Control-Request-Method": "GET"}
        async with kit.http.options(kit.url + "/v1/models", headers=bare) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Headers"] == cors.DEFAULT_ALLOW_HEADERS
        evil = {**PREFLIGHT, "Origin": "https://evil.example.com"}
        async with kit.http.options(kit.url + "/v1/chat/completions", headers=evil) as r:
            assert r.status == 403
            error = (await r.json())["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("permission_error", "origin_not_allowed")
            assert not _cors_names(dict(r.headers))
        # OPTIONS that is not a preflight is answered as before.
        async with kit.http.options(kit.url + "/v1/chat/completions", headers={"Origin": APP}) as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"


async def test_any_origin_is_answered_with_a_star_and_no_vary() -> None:
    async with gateway_kit(cors_origins=("*",)) as kit:
        await kit.replica("a")
        assert kit.http is not None
        headers = {**PREFLIGHT, "Origin": "http://localhost:5173"}
        async with kit.http.options(kit.url + "/v1/chat/completions", headers=headers) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "*"
            assert "Vary" not in r.headers
        status, answer, _ = await kit.post(chat(), headers={"Origin": "http://localhost:5173"})
        assert status == 200 and answer["Access-Control-Allow-Origin"] == "*"


async def test_fast_edge_answers_carry_the_headers_for_an_allowed_origin_only() -> None:
    async with gateway_kit(cors_origins=(APP,)) as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1))
        origin = f"Origin: {APP}\r\n"
        ok, missing, stream = await exchange(
            kit,
            post(extra=origin)
            + post(json.dumps(chat(model="no-such-model")).encode(), extra=origin)
            + post(json.dumps(chat(max_tokens=3, stream=True)).encode(), extra=origin),
            3,
        )
        assert [ok["status"], missing["status"], stream["status"]] == [200, 404, 200]
        assert stream["headers"]["content-type"].startswith("text/event-stream")
        for answer in (ok, missing, stream):
            headers = answer["headers"]
            assert headers["access-control-allow-origin"] == APP
            assert headers["vary"] == "Origin"
            exposed = {h.strip().lower() for h in headers["access-control-expose-headers"].split(",")}
            assert {
                "x-request-id",
                "x-otela-request-id",
                "x-otela-model",
                "x-otela-node",
                "retry-after",
            } <= exposed
            assert "access-control-allow-credentials" not in headers
        assert kit.gateway._edge is not None and kit.gateway._edge.handovers == 0
        (other,) = await exchange(kit, post(extra="Origin: https://evil.example.com\r\n"), 1)
        (none,) = await exchange(kit, post(), 1)
        assert other["status"] == none["status"] == 200
        assert not _cors_names(other["headers"]) and not _cors_names(none["headers"])
        # A request refused before it is parsed whole (413) carries them too.
        (big,) = await exchange(
            kit, f"POST /v1/chat/completions HTTP/1.1\r\n{origin}Content-Length: 99999999\r\n\r\n".encode(), 1
        )
        assert big["status"] == 413 and big["headers"]["access-control-allow-origin"] == APP


async def test_aiohttp_answers_after_a_handover_carry_them_too() -> None:
    async with gateway_kit(cors_origins=(APP,)) as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1))
        get = f"GET /v1/models HTTP/1.1\r\nHost: t\r\nOrigin: {APP}\r\n\r\n".encode()
        models, stream, health = await exchange(
            kit,
            get
            + post(json.dumps(chat(max_tokens=3, stream=True)).encode(), extra=f"Origin: {APP}\r\n")
            + f"GET /metrics HTTP/1.1\r\nHost: t\r\nOrigin: {APP}\r\n\r\n".encode(),
            3,
        )
        assert kit.gateway._edge is not None and kit.gateway._edge.handovers == 1
        assert models["status"] == stream["status"] == 200
        assert stream["body"].rstrip().endswith(b"data: [DONE]")
        for answer in (models, stream):
            assert answer["headers"]["access-control-allow-origin"] == APP
            assert "x-otela-request-id" in answer["headers"]["access-control-expose-headers"].lower()
        assert not _cors_names(health["headers"])  # not the /v1 API


async def test_with_the_default_configuration_nothing_changes() -> None:
    assert GatewayConfig().cors_origins == ()
    async with gateway_kit() as kit:
        await kit.replica("a")
        assert kit.http is not None
        assert kit.gateway._edge is not None and kit.gateway._edge.cors is None
        async with kit.http.options(kit.url + "/v1/chat/completions", headers=PREFLIGHT) as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"
            assert (await r.json())["error"]["code"] == "method_not_allowed"
            assert not _cors_names(dict(r.headers))
        status, headers, _ = await kit.post(chat(), headers={"Origin": APP})
        assert status == 200 and not _cors_names(dict(headers))
        async with kit.http.get(kit.url + "/v1/models", headers={"Origin": APP}) as r:
            assert r.status == 200 and not _cors_names(dict(r.headers))


@pytest.mark.parametrize("entry", ["https://app.example.org/", "app.example.org", "null", "https://a.org/x"])
def test_a_malformed_origin_is_refused_by_name(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.cors_origins") as caught:
        GatewayConfig(cors_origins=("https://ok.example.org", entry))
    assert repr(entry) in str(caught.value) and "ok.example.org" not in str(caught.value)
