"""The node -> engine HTTP client against scripted servers on loopback TCP and Unix sockets."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.node.engine_client import EngineClient, EngineConnectionError, EngineTarget
from scripted_engine import ok, read_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback TCP server (and optionally a Unix socket) running `handler` per connection."""

    def __init__(self, handler: Handler, tmp_path: os.PathLike[str] | None = None) -> None:
        self.handler = handler
        self.connections = 0
        self.sock_path = os.path.join(tmp_path, "engine.sock") if tmp_path is not None else None
        self._servers: list[asyncio.AbstractServer] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> EngineTarget:
        tcp = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._servers.append(tcp)
        port = tcp.sockets[0].getsockname()[1]
        if self.sock_path is not None:
            self._servers.append(await asyncio.start_unix_server(self._serve, self.sock_path))
        return EngineTarget(f"http://127.0.0.1:{port}", self.sock_path)

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()


async def echo_keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        head, body = await read_request(reader)
        writer.write(ok(b'{"echo":"' + body + b'","path":"' + head.split(b" ")[1] + b'"}'))
        await writer.drain()


@pytest.mark.parametrize("unix", [False, True])
async def test_requests_reuse_one_connection(tmp_path, unix) -> None:
    server = Server(echo_keepalive, tmp_path if unix else None)
    async with server as target:
        client = EngineClient()
        for i in range(3):
            async with client.request(target, "POST", "/v1/chat/completions", b"x%d" % i) as resp:
                assert resp.status == 200 and resp.headers["content-type"] == "application/json"
                assert resp.content_length is not None
                assert await resp.read() == b'{"echo":"x%d","path":"/v1/chat/completions"}' % i
        assert client.opened == 1 and server.connections == 1
        await client.aclose()


async def test_a_missing_socket_falls_back_to_tcp(tmp_path) -> None:
    async with Server(echo_keepalive) as target:
        client = EngineClient()
        missing = EngineTarget(target.base_url, str(tmp_path / "gone.sock"))
        async with client.request(missing, "POST", "/v1/completions", b"a") as resp:
            assert await resp.read() == b'{"echo":"a","path":"/v1/completions"}'
        await client.aclose()


async def test_chunked_body_arrives_as_it_is_sent() -> None:
    go_on = asyncio.Event()

    async def streamer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"6\r\ndata 1\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection until the client is done

    async with Server(streamer) as target:
        client = EngineClient()
        async with client.request(target, "POST", "/v1/chat/completions", b"{}") as resp:
            assert resp.content_length is None
            chunks = resp.chunks()
            assert await anext(chunks) == b"data 1"  # before the server wrote the rest
            go_on.set()
            assert b"".join([c async for c in chunks]) == b"data 2"
        await client.aclose()


async def test_body_until_close_without_length() -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    server = Server(old_style)
    async with server as target:
        client = EngineClient()
        for _ in range(2):
            async with client.request(target, "GET", "/v1/models") as resp:
                assert await resp.read() == b"all of it"
        assert server.connections == 2  # never pooled: the answer ended with the connection
        await client.aclose()


async def test_a_pooled_connection_the_engine_closed_is_retried_once() -> None:
    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(ok(body))  # says keep-alive, then closes anyway (an idle timeout on the engine's side)
        await writer.drain()

    server = Server(one_per_connection)
    async with server as target:
        client = EngineClient()
        async with client.request(target, "POST", "/v1/completions", b"first") as resp:
            assert await resp.read() == b"first"
        await asyncio.sleep(0.05)  # the engine's close reaches the pooled connection
        async with client.request(target, "POST", "/v1/completions", b"second") as resp:
            assert await resp.read() == b"second"
        assert server.connections == 2
        await client.aclose()


async def test_an_engine_that_dies_mid_body_is_an_error() -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    async with Server(dies) as target:
        client = EngineClient()
        with pytest.raises(EngineConnectionError):
            async with client.request(target, "POST", "/v1/completions", b"{}") as resp:
                await resp.read()
        await client.aclose()


async def test_nobody_listening_is_a_connection_error() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    client = EngineClient()
    with pytest.raises(EngineConnectionError, match="cannot connect"):
        async with client.request(EngineTarget(f"http://127.0.0.1:{port}"), "GET", "/v1/models"):
            pass


async def test_silence_past_the_read_timeout_raises_and_drops_the_connection() -> None:
    seen_eof = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # returns when the client closes
        seen_eof.set()

    async with Server(silent) as target:
        client = EngineClient(read_timeout=0.1)
        with pytest.raises(TimeoutError):
            async with client.request(target, "POST", "/v1/completions", b"{}"):
                pass
        await asyncio.wait_for(seen_eof.wait(), 2)
        await client.aclose()


async def test_cancelling_a_request_closes_its_connection() -> None:
    seen_eof = asyncio.Event()
    started = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        started.set()
        await reader.read()
        seen_eof.set()  # what tells an engine to stop generating

    async with Server(slow) as target:
        client = EngineClient()

        async def call() -> None:
            async with client.request(target, "POST", "/v1/completions", b"{}"):
                pass

        task = asyncio.create_task(call())
        await asyncio.wait_for(started.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(seen_eof.wait(), 2)


async def test_header_values_cannot_split_the_request() -> None:
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head)
        writer.write(ok(b"{}"))
        await writer.drain()
        await reader.read()

    async with Server(record) as target:
        client = EngineClient()
        headers = {"X-Request-Id": "abc", "X-Evil": "a\r\nX-Injected: 1", "Content-Length": "999"}
        async with client.request(target, "POST", "/v1/completions", b"{}", headers) as resp:
            await resp.read()
        await client.aclose()
    assert b"X-Request-Id: abc\r\n" in heads[0]
    assert b"X-Injected" not in heads[0]
    # The caller's Content-Length is replaced by the body's own (the port may contain "999").
    assert b"Content-Length: 2\r\n" in heads[0] and b"Content-Length: 999" not in heads[0]


async def test_a_large_body_streams_through_flow_control() -> None:
    payload = os.urandom(3 * 1024 * 1024)

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(payload))
        await writer.drain()
        await reader.read()

    async with Server(big) as target:
        client = EngineClient()
        got = bytearray()
        async with client.request(target, "POST", "/v1/embeddings", b"{}") as resp:
            async for chunk in resp.chunks():
                got += chunk
                await asyncio.sleep(0)  # a slow reader: the connection pauses and resumes
        assert bytes(got) == payload
        await client.aclose()


@settings(max_examples=40, deadline=None)
@given(
    parts=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=30), max_size=12),
)
def test_any_fragmentation_of_a_chunked_answer_gives_the_same_body(parts, cuts) -> None:
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"

    async def fragmented(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        pos = 0
        for cut in cuts:
            writer.write(wire[pos : pos + cut])
            await writer.drain()
            await asyncio.sleep(0)
            pos += cut
        writer.write(wire[pos:])
        await writer.drain()
        await reader.read()

    async def main() -> bytes:
        async with Server(fragmented) as target:
            client = EngineClient()
            async with client.request(target, "POST", "/v1/completions", b"{}") as resp:
                body = await resp.read()
            await client.aclose()
            return body

    assert asyncio.run(main()) == b"".join(parts)
