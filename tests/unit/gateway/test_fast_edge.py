"""The gateway's own HTTP edge: inference served on it, everything else handed to aiohttp mid-connection, and
HTTP's framing, limits and deadlines kept, over real sockets."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meshkit import MODEL, GatewayKit, chat, gateway_kit

from opentela.engines.simulated import SimulatedConfig

BODY = json.dumps(chat()).encode()


def post(body: bytes = BODY, path: str = "/v1/chat/completions", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def exchange(
    kit: GatewayKit, data: bytes, answers: int, *, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Send `data` on one connection and read `answers` HTTP responses from it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", kit.gateway.url.rsplit(":", 1)[1])
    writer.write(data)
    try:
        return [await asyncio.wait_for(read_response(reader), timeout) for _ in range(answers)]
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One HTTP/1.1 response: status, headers (lower-case names) and body, de-chunked."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = dict((k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in head[1:] if line))
    if status == 100:
        return {"status": 100, "headers": headers, "body": b""}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
    else:
        body = await reader.read()
    return {"status": status, "headers": headers, "body": body}


async def test_pipelined_inference_requests_and_a_get_are_answered_in_order() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        one, two, models = await exchange(
            kit, post() + post() + b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n", 3
        )
        assert [one["status"], two["status"], models["status"]] == [200, 200, 200]
        assert json.loads(one["body"])["object"] == "chat.completion"
        assert [m["id"] for m in json.loads(models["body"])["data"]] == [MODEL]
        assert one["headers"]["x-otela-request-id"] != two["headers"]["x-otela-request-id"]
        edge = kit.gateway._edge
        assert edge is not None and edge.served == 2 and edge.handovers == 1


async def test_a_keepalive_client_mixing_routes_is_served_throughout() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        assert kit.http is not None
        for _ in range(3):  # aiohttp's client keeps one connection: the first GET hands it over mid-way
            status, _, body = await kit.post(chat())
            assert status == 200 and json.loads(body)["choices"]
            async with kit.http.get(kit.url + "/v1/models") as resp:
                assert resp.status == 200
        assert len(kit.http.connector._conns) == 1  # type: ignore[union-attr]


async def test_a_chunked_body_is_served_on_the_fast_path() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        halves = BODY[:7], BODY[7:]
        chunks = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in halves) + b"0\r\n\r\n"
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        (answer,) = await exchange(kit, head + chunks, 1)
        assert answer["status"] == 200 and json.loads(answer["body"])["model"] == MODEL
        assert kit.gateway._edge is not None and kit.gateway._edge.served == 1


async def test_expect_continue_gets_its_go_ahead_and_an_h2c_offer_goes_to_aiohttp() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {len(BODY)}"
        reader, writer = await asyncio.open_connection("127.0.0.1", kit.gateway.url.rsplit(":", 1)[1])
        writer.write(f"{head}\r\n\r\n".encode())
        assert (await asyncio.wait_for(read_response(reader), 10))["status"] == 100
        writer.write(BODY)
        assert (await asyncio.wait_for(read_response(reader), 10))["status"] == 200
        writer.close()
        edge = kit.gateway._edge
        assert edge is not None and (edge.served, edge.handovers) == (1, 0)
        offer = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n"
        (answer,) = await exchange(kit, post(extra=offer), 1)
        assert answer["status"] == 200 and json.loads(answer["body"])["choices"]
        assert (edge.served, edge.handovers) == (1, 1)


async def test_an_event_stream_is_chunked_and_ends_with_done() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1))
        (answer,) = await exchange(kit, post(json.dumps(chat(max_tokens=4, stream=True)).encode()), 1)
        assert answer["headers"]["transfer-encoding"] == "chunked"
        assert answer["headers"]["content-type"].startswith("text/event-stream")
        events = [line for line in answer["body"].decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 5


async def test_http_1_0_is_answered_and_closed() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        data = f"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {len(BODY)}\r\n\r\n".encode() + BODY
        (answer,) = await exchange(kit, data, 1)
        assert answer["status"] == 200 and answer["headers"]["connection"] == "close"
        stream = json.dumps(chat(max_tokens=3, stream=True)).encode()
        data = (
            f"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {len(stream)}\r\n\r\n".encode() + stream
        )
        (answer,) = await exchange(
            kit, data, 1
        )  # no chunked framing for 1.0: the body ends with the connection
        assert "transfer-encoding" not in answer["headers"] and answer["body"].rstrip().endswith(b"[DONE]")


async def test_bad_http_and_oversized_bodies_get_openai_errors_and_a_closed_connection() -> None:
    async with gateway_kit(max_body_bytes=4096) as kit:
        await kit.replica("a")
        (bad,) = await exchange(kit, b"\x00\x01 nonsense\r\n\r\n", 1)
        assert bad["status"] == 400 and json.loads(bad["body"])["error"]["type"] == "invalid_request_error"
        assert bad["headers"]["connection"] == "close"
        # Refused from the head alone: the client need not send the body.
        (big,) = await exchange(
            kit, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", 1
        )
        assert big["status"] == 413 and "too large" in json.loads(big["body"])["error"]["message"]
        head = b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        (chunked,) = await exchange(kit, head + b"%x\r\n%b\r\n" % (5000, b"x" * 5000), 1)
        assert chunked["status"] == 413
        (ok,) = await exchange(kit, post(), 1)  # and the gateway goes on serving
        assert ok["status"] == 200


async def test_idle_and_slow_head_connections_are_closed_by_their_deadlines() -> None:
    async with gateway_kit(keepalive_timeout=0.5, header_timeout=0.3) as kit:
        await kit.replica("a")
        port = kit.gateway.url.rsplit(":", 1)[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post())
        assert (await read_response(reader))["status"] == 200
        assert await asyncio.wait_for(reader.read(), 3) == b""  # idle after its answer: closed
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n")  # a head that never completes
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()


async def test_an_unknown_model_is_refused_on_the_fast_path() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        (answer,) = await exchange(kit, post(json.dumps(chat(model="no-such-model")).encode()), 1)
        assert answer["status"] == 404 and json.loads(answer["body"])["error"]["code"] == "model_not_found"
        assert kit.gateway._edge is not None and kit.gateway._edge.handovers == 0


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = b"", 0
    for size in [*sizes, len(body)]:
        piece = body[at : at + max(1, size)]
        if piece:
            out += b"%x\r\n%b\r\n" % (len(piece), piece)
        at += len(piece)
    return out + b"0\r\n\r\n"


REQUEST_KINDS = st.sampled_from(["post", "chunked", "get", "completions"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(REQUEST_KINDS, min_size=1, max_size=4),
    chunk_sizes=st.lists(st.integers(1, 40), max_size=4),
    cuts=st.lists(st.integers(1, 2000), max_size=6),
)
def test_requests_split_anywhere_and_pipelined_are_answered_in_order(
    kinds: list[str], chunk_sizes: list[int], cuts: list[int]
) -> None:
    wire = b""
    for kind in kinds:
        if kind == "post":
            wire += post()
        elif kind == "chunked":
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            wire += head + _chunked(BODY, chunk_sizes)
        elif kind == "completions":
            wire += post(
                json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(), "/v1/completions"
            )
        else:
            wire += b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"
    points = sorted({c % len(wire) for c in cuts} - {0})
    pieces = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]

    async def case() -> list[dict[str, Any]]:
        async with gateway_kit() as kit:
            await kit.replica("a")
            reader, writer = await asyncio.open_connection("127.0.0.1", kit.gateway.url.rsplit(":", 1)[1])
            for piece in pieces:  # each piece its own write: the server sees the requests cut at these points
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.002)
            answers = [await asyncio.wait_for(read_response(reader), 10) for _ in kinds]
            writer.close()
            return answers

    answers = asyncio.run(case())
    for kind, answer in zip(kinds, answers, strict=True):
        assert answer["status"] == 200, (kind, answer)
        obj = json.loads(answer["body"])["object"]
        assert obj == {"get": "list", "completions": "text_completion"}.get(kind, "chat.completion")


async def test_a_gzipped_body_is_inflated_by_aiohttp() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a")
        (answer,) = await exchange(kit, post(gzip.compress(BODY), extra="Content-Encoding: gzip\r\n"), 1)
        assert answer["status"] == 200 and json.loads(answer["body"])["choices"]
        assert kit.gateway._edge is not None and kit.gateway._edge.handovers == 1
