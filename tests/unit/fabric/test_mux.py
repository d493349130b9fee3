"""Streams over a real TLS connection: concurrency, flow control, half-close, reset, limits, keepalive."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable

import pytest
from fabric_helpers import HostFactory, read_all, wait_until

from opentela._types import Stream
from opentela.errors import ConnectionClosedError, StreamResetError
from opentela.fabric._config import FabricConfig
from opentela.fabric._frames import INITIAL_WINDOW, ErrorCode
from opentela.fabric.host import Host
from opentela.fabric.stream import MuxStream

Pair = tuple[Host, Host]


@pytest.fixture
async def pair(make_host: HostFactory) -> Pair:
    """Two connected hosts: (dialer, listener)."""
    a, b = await make_host(), await make_host()
    await a.connect(b.listen_addrs[0])
    await wait_until(lambda: b.is_connected(a.peer_id))
    return a, b


def serve(host: Host, protocol: str) -> Callable[[Callable[[Stream], Awaitable[None]]], None]:
    def register(handler: Callable[[Stream], Awaitable[None]]) -> None:
        host.set_handler(protocol, handler)

    return register


async def request(a: Host, b: Host, protocol: str, payload: bytes) -> bytes:
    stream = await a.open_stream(b.peer_id, protocol)
    await stream.write(payload)
    await stream.write_eof()
    return await read_all(stream)


async def test_many_concurrent_streams_on_one_connection(pair: Pair) -> None:
    a, b = pair
    payloads = [os.urandom(i * 37 % 5000) for i in range(300)]
    replies = await asyncio.gather(*(request(a, b, "/echo", p) for p in payloads))
    assert replies == payloads
    conn_a, conn_b = a.connection(b.peer_id), b.connection(a.peer_id)
    await wait_until(lambda: conn_a.stream_count == 0 and conn_b.stream_count == 0)
    assert len(a._live) == 1 and len(b._live) == 1


async def test_stream_ids_follow_the_dialer_odd_listener_even_rule(pair: Pair) -> None:
    a, b = pair
    ids_a = [(await a.open_stream(b.peer_id, "/echo")).stream_id for _ in range(3)]
    ids_b = [(await b.open_stream(a.peer_id, "/echo")).stream_id for _ in range(3)]
    assert all(i % 2 == 1 for i in ids_a) and ids_a == sorted(ids_a)
    assert all(i % 2 == 0 for i in ids_b) and ids_b == sorted(ids_b)


async def test_large_transfer_both_ways(pair: Pair) -> None:
    a, b = pair
    size = 6 * 1024 * 1024 + 123

    @serve(b, "/sink")
    async def sink(stream: Stream) -> None:
        digest = hashlib.sha256()
        while chunk := await stream.read():
            digest.update(chunk)
        await stream.write(digest.digest())

    @serve(b, "/source")
    async def source(stream: Stream) -> None:
        n = int(await stream.read())
        block = bytes(range(256)) * 4096
        while n:
            await stream.write(block[: min(n, len(block))])
            n -= min(n, len(block))

    data = os.urandom(size)
    assert await request(a, b, "/sink", data) == hashlib.sha256(data).digest()
    received = await request(a, b, "/source", str(size).encode())
    assert len(received) == size and received[:512] == bytes(range(256)) * 2


async def test_a_reader_that_stops_reading_stalls_the_writer(pair: Pair) -> None:
    a, b = pair
    go = asyncio.Event()
    server_side: list[MuxStream] = []

    @serve(b, "/lazy")
    async def lazy(stream: Stream) -> None:
        assert isinstance(stream, MuxStream)
        server_side.append(stream)
        await go.wait()
        await stream.write(hashlib.sha256(await read_all(stream)).digest())

    stream = await a.open_stream(b.peer_id, "/lazy")
    assert isinstance(stream, MuxStream)
    data = os.urandom(3 * 1024 * 1024)

    async def send() -> None:
        await stream.write(data)
        await stream.write_eof()

    writer = asyncio.create_task(send())
    await wait_until(lambda: stream._send_window == 0 and bool(server_side))
    await asyncio.sleep(0.1)
    # The writer is parked on credit, and the receiver holds at most one window: no unbounded buffering.
    assert not writer.done()
    assert server_side[0]._buffered <= INITIAL_WINDOW
    go.set()
    await writer
    assert await read_all(stream) == hashlib.sha256(data).digest()


async def test_half_close_keeps_the_other_direction_open(pair: Pair) -> None:
    a, b = pair

    @serve(b, "/after-eof")
    async def after_eof(stream: Stream) -> None:
        got = await read_all(stream)
        for i in range(3):
            await asyncio.sleep(0.01)
            await stream.write(b"%d:%s;" % (i, got))
        await stream.write_eof()

    stream = await a.open_stream(b.peer_id, "/after-eof")
    await stream.write(b"q")
    await stream.write_eof()
    await stream.write_eof()  # idempotent
    with pytest.raises(RuntimeError):
        await stream.write(b"more")
    assert await read_all(stream) == b"0:q;1:q;2:q;"
    assert await stream.read() == b""


async def test_reset_by_the_opener_reaches_the_handler(pair: Pair) -> None:
    a, b = pair
    seen: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    @serve(b, "/wait")
    async def wait(stream: Stream) -> None:
        try:
            await stream.read(1)
            await stream.read()
        except StreamResetError as exc:
            seen.set_result(exc)
            raise

    stream = await a.open_stream(b.peer_id, "/wait")
    await stream.write(b"x")
    await asyncio.sleep(0.05)
    stream.reset(0x155, "changed my mind")
    exc = await asyncio.wait_for(seen, 2)
    assert isinstance(exc, StreamResetError) and exc.reset_code == 0x155 and "changed my mind" in str(exc)
    with pytest.raises(StreamResetError):
        await stream.read()
    with pytest.raises(StreamResetError):
        await stream.write(b"y")


async def test_reset_by_the_handler_reaches_the_opener(pair: Pair) -> None:
    a, b = pair

    @serve(b, "/refuse")
    async def refuse(stream: Stream) -> None:
        await stream.read(1)
        stream.reset(0x177, "no thanks")

    stream = await a.open_stream(b.peer_id, "/refuse")
    await stream.write(b"x")
    with pytest.raises(StreamResetError) as info:
        await stream.read()
    assert info.value.reset_code == 0x177 and "no thanks" in str(info.value)
    with pytest.raises(StreamResetError):
        await stream.write(b"more")


async def test_unknown_protocol_is_reset_with_a_clear_reason(pair: Pair) -> None:
    a, b = pair
    stream = await a.open_stream(b.peer_id, "/nobody/home/1")
    await stream.write(b"hello?")
    with pytest.raises(StreamResetError) as info:
        await stream.read()
    assert info.value.reset_code == ErrorCode.UNKNOWN_PROTOCOL
    assert "/nobody/home/1" in str(info.value)


async def test_a_full_response_survives_the_handler_closing_early(pair: Pair) -> None:
    a, b = pair

    @serve(b, "/early")
    async def early(stream: Stream) -> None:
        await stream.readexactly(3)  # returns without waiting for the opener's EOF
        await stream.write(b"answer" * 1000)

    stream = await a.open_stream(b.peer_id, "/early")
    await stream.write(b"abc")
    assert await read_all(stream) == b"answer" * 1000
    # The handler's side is gone: our further writes are refused.
    await wait_until(lambda: stream.closed)
    with pytest.raises(StreamResetError):
        await stream.write(b"late")


async def test_excess_inbound_streams_are_refused(make_host: HostFactory) -> None:
    a = await make_host()
    b = await make_host(config=FabricConfig(max_inbound_streams=3))
    await a.connect(b.listen_addrs[0])
    go = asyncio.Event()

    @serve(b, "/hold")
    async def hold(stream: Stream) -> None:
        await go.wait()
        await stream.write(await read_all(stream))

    streams = [await a.open_stream(b.peer_id, "/hold") for _ in range(5)]
    for i, stream in enumerate(streams):
        await stream.write(b"%d" % i)
        await stream.write_eof()
    for stream in streams[3:]:
        with pytest.raises(StreamResetError) as info:
            await stream.read()
        assert info.value.reset_code == ErrorCode.REFUSED_STREAM and "too many streams" in str(info.value)
    go.set()
    assert [await read_all(s) for s in streams[:3]] == [b"0", b"1", b"2"]
    # Slots are released: new streams are accepted again.
    assert await request(a, b, "/echo", b"again") == b"again"


async def test_handler_failure_resets_the_stream_and_the_host_keeps_serving(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair

    @serve(b, "/boom")
    async def boom(stream: Stream) -> None:
        raise ValueError("handler bug")

    stream = await a.open_stream(b.peer_id, "/boom")
    await stream.write(b"x")
    with pytest.raises(StreamResetError) as info:
        await stream.read()
    assert info.value.reset_code == ErrorCode.INTERNAL_ERROR
    assert "handler bug" in caplog.text
    assert await request(a, b, "/echo", b"still here") == b"still here"


async def test_readexactly_beyond_the_window_and_early_eof(pair: Pair) -> None:
    a, b = pair

    @serve(b, "/blob")
    async def blob(stream: Stream) -> None:
        n = int(await stream.read())
        await stream.write(b"z" * n)
        await stream.write_eof()

    big = 3 * INITIAL_WINDOW + 5
    stream = await a.open_stream(b.peer_id, "/blob")
    await stream.write(str(big).encode())
    assert await stream.readexactly(big) == b"z" * big
    stream = await a.open_stream(b.peer_id, "/blob")
    await stream.write(b"10")
    with pytest.raises(asyncio.IncompleteReadError) as info:
        await stream.readexactly(11)
    assert info.value.partial == b"z" * 10


async def test_cancelling_blocked_reads_and_writes_leaks_nothing(pair: Pair) -> None:
    a, b = pair
    go = asyncio.Event()

    @serve(b, "/slow")
    async def slow(stream: Stream) -> None:
        await go.wait()
        await stream.write(b"late reply")
        await read_all(stream)

    stream = await a.open_stream(b.peer_id, "/slow")
    assert isinstance(stream, MuxStream)
    reader = asyncio.create_task(stream.read())
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert stream._read_waiter is None
    # Fill the window so the next write parks on credit, then cancel it.
    writer = asyncio.create_task(stream.write(b"w" * (INITIAL_WINDOW + 10)))
    await wait_until(lambda: stream._send_window == 0)
    await asyncio.sleep(0.02)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert stream._write_waiter is None
    go.set()
    assert await stream.read() == b"late reply"  # the stream still works after both cancellations
    stream.reset()
    await a.aclose()
    await b.aclose()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_keepalive_detects_a_silent_peer(make_host: HostFactory) -> None:
    a = await make_host(config=FabricConfig(keepalive_interval=0.2, keepalive_timeout=0.2))
    b = await make_host()
    gone: list[str] = []
    a.on_peer_disconnected(gone.append)
    await a.connect(b.listen_addrs[0])
    await asyncio.sleep(0.7)  # several intervals: pings are answered, the connection stays
    assert a.is_connected(b.peer_id)
    stream = await a.open_stream(b.peer_id, "/echo")
    await stream.write(b"x")
    assert await stream.read() == b"x"
    transport = b.connection(a.peer_id)._transport
    transport.pause_reading()  # b goes silent (a hung process, a dead link)
    async with asyncio.timeout(3):
        with pytest.raises(ConnectionClosedError, match="keepalive"):
            await stream.read()
    assert gone == [b.peer_id] and not a.is_connected(b.peer_id)
    transport.resume_reading()  # so b notices the abort now rather than at its close timeout
