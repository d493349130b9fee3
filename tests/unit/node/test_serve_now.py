"""The serving node's no-task path (LocalEngineProxy.serve_now) against scripted engines on loopback TCP: what it
answers from the engine connection's callback, and every case it must hand to a task instead."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from opentela._types import PROTO_HTTP, Stream
from opentela.errors import StreamResetError
from opentela.fabric.http_tunnel import (
    TunnelRequest,
    TunnelResponseHead,
    encode_request,
    read_response_head,
)
from opentela.fabric.identity import Identity
from opentela.fabric.memory import memory_stream_pair
from opentela.node.engine_client import EngineTarget
from opentela.node.http_service import LocalEngineProxy
from scripted_engine import ok, read_request

A, B = Identity.generate().peer_id, Identity.generate().peer_id
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Engine:
    """A scripted engine: `make(engine)` gives the handler each connection runs; counts connections and notes
    when the client ended one."""

    def __init__(self, make: Callable[[Engine], Handler]) -> None:
        self.handler = make(self)
        self.connections = 0
        self.closed_by_client = 0
        self.requests: list[bytes] = []
        self._server: asyncio.AbstractServer | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except asyncio.IncompleteReadError:
            self.closed_by_client += 1
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Engine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def target(self) -> EngineTarget:
        assert self._server is not None
        return EngineTarget(f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}")


def replying(reply: Callable[[bytes], bytes | None]) -> Callable[[Engine], Handler]:
    """An engine that answers each request of a connection with `reply(body)`, noting its head; None: it never
    answers that one (the handler then ends when the client closes the connection)."""

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head, body = await read_request(reader)
                engine.requests.append(head)
                answer = reply(body)
                if answer is None:
                    await reader.readexactly(1)  # raises once the client closes the connection
                    return
                writer.write(answer)
                await writer.drain()

        return handle

    return make


echo = replying(lambda body: ok(b'{"echo":' + body + b"}"))


def after_one_answer(then: Handler) -> Callable[[Engine], Handler]:
    """An engine that answers a connection's first request (the warm-up) and hands the next one to `then`."""

    def make(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(ok(b"{}"))
            await writer.drain()
            await then(reader, writer)

        return handle

    return make


async def request_stream(body: bytes = BODY, *, finished: bool = True) -> tuple[Stream, Stream]:
    """(the asker's end, the serving node's end) with a tunnelled chat request written into it."""
    ours, theirs = memory_stream_pair(PROTO_HTTP, A, B)
    data = encode_request(
        TunnelRequest("POST", "/v1/chat/completions", body, "rid-1", {"content-type": "application/json"})
    )
    await ours.write(data)
    if finished:
        await ours.write_eof()
    return ours, theirs


async def answer_of(ours: Stream) -> tuple[TunnelResponseHead, bytes]:
    head = await asyncio.wait_for(read_response_head(ours), 5)
    chunks = []
    while chunk := await asyncio.wait_for(ours.read(), 5):
        chunks.append(chunk)
    return head, b"".join(chunks)


async def warm(proxy: LocalEngineProxy) -> None:
    """One request through the task path, which leaves an idle pooled connection behind."""
    ours, theirs = await request_stream()
    _, (head, _) = await asyncio.gather(proxy.handle_stream(theirs), answer_of(ours))
    assert head.status == 200


async def warmed(engine: Engine, read_timeout: float = 600.0) -> LocalEngineProxy:
    """A proxy to `engine` with an idle pooled connection, ready for `serve_now`."""
    proxy = LocalEngineProxy(lambda _m: engine.target, max_body=1 << 20, read_timeout=read_timeout)
    await warm(proxy)
    return proxy


async def test_a_whole_request_is_answered_from_the_engine_connections_callback() -> None:
    async with Engine(echo) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, body = await answer_of(ours)
        assert head.status == 200 and head.headers == {"content-type": "application/json"}
        assert json.loads(body) == {"echo": json.loads(BODY)}
        assert (proxy.served_now, proxy.served, proxy.in_flight, proxy.busy) == (
            1,
            2,
            0,
            {engine.target.base_url: 0},
        )
        assert engine.connections == 1  # the pooled connection was used, and given back
        assert b"X-Request-Id: rid-1" in engine.requests[-1]
        assert theirs.closed
        await proxy.aclose()


async def test_a_request_still_arriving_is_left_to_the_task_with_nothing_read() -> None:
    async with Engine(echo) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream(finished=False)
        assert proxy.serve_now(theirs) is False
        await ours.write_eof()
        await proxy.handle_stream(theirs)
        head, body = await answer_of(ours)
        assert head.status == 200 and json.loads(body) == {"echo": json.loads(BODY)}
        assert proxy.served_now == 0
        await proxy.aclose()


async def test_with_no_idle_connection_it_goes_on_in_a_task() -> None:
    async with Engine(echo) as engine:
        proxy = LocalEngineProxy(lambda _m: engine.target, max_body=1 << 20)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, body = await answer_of(ours)
        assert head.status == 200 and json.loads(body) == {"echo": json.loads(BODY)}
        assert (proxy.served_now, proxy.served, proxy.in_flight) == (0, 1, 0)
        await proxy.aclose()


async def test_no_engine_for_the_model_is_an_error_answer() -> None:
    proxy = LocalEngineProxy(lambda _m: None, max_body=1 << 20)
    ours, theirs = await request_stream()
    assert proxy.serve_now(theirs) is True
    head, body = await answer_of(ours)
    assert head.status == 503 and head.error_code == "engine_unavailable"
    assert json.loads(body)["error"]["code"] == "engine_unavailable"
    await proxy.aclose()


async def test_a_streamed_answer_goes_on_in_a_task_chunk_by_chunk() -> None:
    def streamed(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for i in range(3):
                    event = b"data: %d\n\n" % i
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    await asyncio.sleep(0.02)
                writer.write(b"0\r\n\r\n")
                await writer.drain()

        return handle

    async with Engine(streamed) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, body = await answer_of(ours)
        assert head.status == 200 and head.headers["content-type"] == "text/event-stream"
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert (proxy.served_now, proxy.served, proxy.in_flight) == (0, 2, 0)
        await proxy.aclose()


async def test_the_asker_giving_up_closes_the_engine_request() -> None:
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.readexactly(1)  # ends when the client closes the connection

    silent_after_one = after_one_answer(never_answers)

    async with Engine(silent_after_one) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        await asyncio.sleep(0.05)
        assert proxy.in_flight == 1
        ours.reset(0, "client went away")
        for _ in range(100):
            if engine.closed_by_client:
                break
            await asyncio.sleep(0.01)
        assert engine.closed_by_client == 1  # the engine saw its client leave
        assert (proxy.abandoned, proxy.in_flight, proxy.served) == (1, 0, 1)
        await proxy.aclose()


async def test_silence_past_the_read_timeout_is_a_timeout_answer() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    silent_after_one = after_one_answer(silent)

    async with Engine(silent_after_one) as engine:
        proxy = await warmed(engine, read_timeout=0.2)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, _ = await answer_of(ours)
        assert head.status == 504 and head.error_code == "upstream_timeout"
        assert proxy.in_flight == 0
        await proxy.aclose()


async def test_an_idle_connection_the_engine_closed_gets_the_request_again() -> None:
    def one_per_connection(engine: Engine) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(ok(b'{"n":%d}' % engine.connections))
            await writer.drain()
            # Keep-alive was promised, but the connection ends here (as an engine's idle timeout would).

        return handle

    async with Engine(one_per_connection) as engine:
        proxy = await warmed(engine)
        await asyncio.sleep(0.05)  # the engine's close has not been seen by the pool yet, or just was
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, body = await answer_of(ours)
        assert head.status == 200 and json.loads(body) == {"n": 2}
        assert proxy.in_flight == 0
        await proxy.aclose()


async def test_an_engine_dying_mid_answer_is_an_error_answer_before_the_head_and_a_reset_after_it() -> None:
    async def breaks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        if b"streamed" in body:  # the head goes on at once; the stream breaks after one event
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
        else:  # a sized answer is passed on once whole: nothing of it has gone out when it breaks
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.05)

    dies_mid_body = after_one_answer(breaks)

    async with Engine(dies_mid_body) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream(b'{"sized": 1}')
        assert proxy.serve_now(theirs) is True
        head, _ = await answer_of(ours)
        assert head.status == 502 and head.error_code == "engine_crashed"
        await warm(proxy)
        ours, theirs = await request_stream(b'{"streamed": 1}')
        assert proxy.serve_now(theirs) is True
        head = await asyncio.wait_for(read_response_head(ours), 5)
        assert head.status == 200
        with pytest.raises(StreamResetError):
            while await asyncio.wait_for(ours.read(), 5):
                pass
        assert proxy.in_flight == 0
        await proxy.aclose()


async def test_a_malformed_request_resets_the_stream() -> None:
    proxy = LocalEngineProxy(lambda _m: None, max_body=1 << 20)
    ours, theirs = memory_stream_pair(PROTO_HTTP, A, B)
    await ours.write(b"\x00\x00\x00\x02no")
    await ours.write_eof()
    assert proxy.serve_now(theirs) is True
    with pytest.raises(StreamResetError):
        await ours.read()
    await proxy.aclose()


async def test_no_credit_for_the_answer_waits_for_it_in_a_task() -> None:
    big = b"y" * 600_000  # more than the asker's initial window and one frame

    large = replying(lambda _: ok(big))

    async with Engine(large) as engine:
        proxy = await warmed(engine)
        ours, theirs = await request_stream()
        assert proxy.serve_now(theirs) is True
        head, body = await answer_of(ours)
        assert head.status == 200 and body == big
        assert (proxy.served_now, proxy.in_flight) == (0, 0)
        await proxy.aclose()


async def test_a_node_shutting_down_resets_the_streams_it_still_serves() -> None:
    holds = replying(lambda body: None if b"hold" in body else ok(b"{}"))

    async with Engine(holds) as engine:
        proxy = await warmed(engine)
        waiting, theirs = await request_stream(b'{"hold": 1}')
        assert proxy.serve_now(theirs) is True  # waits on the engine connection's callback
        fresh = LocalEngineProxy(lambda _m: engine.target, max_body=1 << 20)
        in_task, theirs_too = await request_stream(b'{"hold": 2}')
        assert fresh.serve_now(theirs_too) is True  # no idle connection: it goes on in a task
        await asyncio.sleep(0.05)
        await proxy.aclose()
        await fresh.aclose()
        for ours in (waiting, in_task):
            with pytest.raises(StreamResetError):
                await asyncio.wait_for(ours.read(), 5)
        assert proxy.in_flight == 0 and fresh.in_flight == 0
