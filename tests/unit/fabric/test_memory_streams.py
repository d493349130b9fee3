"""The in-memory stream pair behaves like a MuxStream: reads, EOF, half-close, reset, flow control."""

from __future__ import annotations

import asyncio

import pytest
from fabric_helpers import read_all, wait_until

from opentela._types import Stream
from opentela.errors import StreamResetError
from opentela.fabric._frames import INITIAL_WINDOW, ErrorCode
from opentela.fabric.memory import memory_stream_pair
from opentela.fabric.stream import MuxStream


def pair() -> tuple[Stream, Stream]:
    return memory_stream_pair("/otela/test/1", "peer-a", "peer-b")


async def test_identity_and_protocol() -> None:
    a, b = pair()
    assert isinstance(a, Stream) and isinstance(b, Stream)
    assert (a.protocol, a.remote_peer, b.remote_peer) == ("/otela/test/1", "peer-b", "peer-a")
    assert a.stream_id == b.stream_id


async def test_request_response_with_half_close() -> None:
    a, b = pair()
    await a.write(b"hello ")
    await a.write(b"world")
    await a.write_eof()
    assert await b.readexactly(6) == b"hello "
    assert await read_all(b) == b"world"
    await b.write(b"reply")
    await b.aclose()
    assert await read_all(a) == b"reply"
    assert a.closed and b.closed  # type: ignore[attr-defined]


async def test_read_sizes_and_incomplete_read() -> None:
    a, b = pair()
    await a.write(b"abcdef")
    assert await b.read(2) == b"ab"
    assert await b.read(0) == b""
    assert await b.read() == b"cdef"
    await a.write(b"xy")
    await a.write_eof()
    with pytest.raises(asyncio.IncompleteReadError) as info:
        await b.readexactly(3)
    assert info.value.partial == b"xy"
    assert await b.read() == b""


async def test_reset_both_ways() -> None:
    a, b = pair()
    a.reset(0x200, "abandoned")
    for op in (b.read(), b.write(b"x")):
        with pytest.raises(StreamResetError) as info:
            await op
        assert info.value.reset_code == 0x200
    with pytest.raises(StreamResetError):
        await a.read()
    c, d = pair()
    d.reset(7, "nope")
    with pytest.raises(StreamResetError, match="nope"):
        await c.read()


async def test_aclose_before_the_peer_finished_resets_its_writes() -> None:
    a, b = pair()
    await a.write(b"request")
    await b.aclose()  # b never read, a is still sending
    assert await read_all(a) == b""
    with pytest.raises(StreamResetError) as info:
        await a.write(b"more")
    assert info.value.reset_code == ErrorCode.CANCEL


async def test_flow_control_parks_the_writer_until_the_reader_reads() -> None:
    a, b = pair()
    assert isinstance(a, MuxStream) and isinstance(b, MuxStream)
    data = b"q" * (3 * INITIAL_WINDOW)
    writer = asyncio.create_task(a.write(data))
    await wait_until(lambda: a._send_window == 0)
    await asyncio.sleep(0.01)
    assert not writer.done() and b._buffered == INITIAL_WINDOW
    received = await b.readexactly(len(data))
    await writer
    assert received == data
