"""Streams: retried only before the first byte, an error event after it, and backpressure from slow clients."""

from __future__ import annotations

import asyncio
import json
import socket

from meshkit import MODEL, chat, gateway_kit

from opentela.engines.simulated import SimulatedConfig


async def read_events(kit, body, headers=None) -> tuple[int, dict[str, str], list[str]]:  # type: ignore[no-untyped-def]
    async with kit.http.post(kit.url + "/v1/chat/completions", json=body, headers=headers or {}) as resp:
        events = [
            line.decode().strip()[len("data: ") :]
            async for line in resp.content
            if line.startswith(b"data: ")
        ]
        return resp.status, dict(resp.headers), events


async def test_failure_after_first_byte_with_resume_off_ends_with_an_error_event_and_no_retry() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0))
        await kit.replica("b", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0))
        off = {"X-Otela-Resume": "off"}
        status, _, events = await read_events(kit, chat(max_tokens=5, stream=True), off)
        assert status == 200
        assert json.loads(events[0])["choices"][0]["delta"]["content"]  # the first token made it
        error = json.loads(events[-1])["error"]
        assert error["code"] == "engine_crashed"
        assert "[DONE]" not in events
        # nothing was replayed elsewhere once the client had bytes
        assert kit.requests_seen("a") + kit.requests_seen("b") == 1
        assert kit.gateway.forwarder.retries == 0


async def test_failure_before_first_byte_of_a_stream_is_retried() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        # crash_events=0: the engine sends its headers, then dies before any event
        dies = SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1, crash_after=0, crash_events=0)
        await kit.replica("a", dies)
        await kit.replica("b", dies)
        await kit.replica("c")
        status, headers, events = await read_events(kit, chat(max_tokens=1, stream=True))
        assert status == 200
        assert events[-1] == "[DONE]"
        assert headers["X-Otela-Session"] == "s-c"


async def test_engine_5xx_before_a_stream_starts_is_retried() -> None:
    async with gateway_kit(policy="round_robin") as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, error_rate=1.0))
        await kit.replica("b", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=1))
        for _ in range(4):
            status, headers, events = await read_events(kit, chat(max_tokens=3, stream=True))
            assert (status, headers["X-Otela-Session"], events[-1]) == (200, "s-b", "[DONE]")


async def test_silent_stream_ends_with_a_timeout_event() -> None:
    async with gateway_kit(idle_timeout=0.3) as kit:
        await kit.replica("a", SimulatedConfig(model=MODEL, ttft_ms=1, itl_ms=5000))
        status, _, events = await read_events(kit, chat(max_tokens=3, stream=True))
        assert status == 200
        assert json.loads(events[-1])["error"]["code"] == "upstream_timeout"


async def test_slow_client_holds_back_the_engine_instead_of_filling_the_ingress() -> None:
    """A client reading a long stream slowly: the engine may only get a bounded amount ahead of it."""
    # The replica advertises no context window; the ingress's cap must let a stream this long through.
    async with gateway_kit(max_output_tokens=4_000_000) as kit:
        engine_cfg = SimulatedConfig(model=MODEL, ttft_ms=0, itl_ms=0)
        await kit.replica("a", engine_cfg)
        handlers = kit.engines["a"].handlers
        assert handlers is not None
        host, port = kit.url.removeprefix("http://").split(":")
        body = json.dumps(chat(max_tokens=2_000_000, stream=True)).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        read = 0
        try:
            while read < 2**20:  # the stream is flowing
                read += len(await reader.read(64 * 1024))
            # The client stops reading. With backpressure end to end the engine soon stalls; a buffering
            # ingress would let it run on towards the 200+ MB of this stream.
            last, stalled_since = -1, 0.0
            deadline = loop.time() + 60
            while loop.time() < deadline:
                produced = handlers.bytes_streamed
                if produced != last:
                    last, stalled_since = produced, loop.time()
                elif loop.time() - stalled_since > 1.0:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the engine never stalled: {handlers.bytes_streamed} bytes produced")
            # What is in flight fits in socket buffers and one stream window, whatever the stream's length.
            assert last - read < 48 * 2**20, (last, read)
            more = 0
            while more < 2**20:  # and it flows again when the client reads
                more += len(await reader.read(64 * 1024))
        finally:
            writer.close()
        # The client went away: the engine stops generating for nobody.
        deadline = loop.time() + 30
        while handlers.active and loop.time() < deadline:  # noqa: ASYNC110 (polling the engine's counter)
            await asyncio.sleep(0.05)
        assert handlers.active == 0
