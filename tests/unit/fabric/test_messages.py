"""Length-prefixed msgpack messages: round trip, limits, malformed input, clean end of stream."""

from __future__ import annotations

import asyncio
import struct

import pytest

from opentela.errors import ProtocolError
from opentela.fabric.memory import memory_stream_pair
from opentela.fabric.messages import encode_msg, read_msg, read_msg_sized, write_msg


async def test_round_trip_of_several_messages() -> None:
    a, b = memory_stream_pair("/otela/gossip/1", "a", "b")
    msgs = [
        {"digest": {"s1": [1, 4]}, "blob": b"\x00\xff"},
        [1, 2.5, None, True],
        "x" * 100_000,
        {3: "int keys"},
    ]
    for msg in msgs:
        await write_msg(a, msg)
    await a.write_eof()
    assert [await read_msg(b) for _ in msgs] == msgs
    with pytest.raises(asyncio.IncompleteReadError) as info:
        await read_msg(b)
    assert info.value.partial == b""


async def test_oversize_is_refused_on_both_sides() -> None:
    a, b = memory_stream_pair("/p", "a", "b")
    with pytest.raises(ProtocolError, match="limit"):
        await write_msg(a, b"x" * 2000, max_size=1000)
    await a.write(struct.pack(">I", 5000) + b"x" * 10)
    with pytest.raises(ProtocolError, match="limit"):
        await read_msg(b, max_size=1000)


@pytest.mark.parametrize(
    ("wire", "needle"),
    [
        (struct.pack(">I", 1) + b"\xc1", "malformed"),  # 0xc1 is never valid msgpack
        (struct.pack(">I", 3) + b"\x93\x01", "ended"),  # truncated body
        (b"\x00\x00", "header"),  # truncated header
        (struct.pack(">I", 2) + b"\x01\x02", "malformed"),  # trailing bytes after one object
    ],
)
async def test_malformed_input_is_a_protocol_error(wire: bytes, needle: str) -> None:
    a, b = memory_stream_pair("/p", "a", "b")
    await a.write(wire)
    await a.write_eof()
    with pytest.raises(ProtocolError, match=needle):
        await read_msg(b)


def test_encoding_is_length_then_msgpack() -> None:
    assert encode_msg([1, 2]) == b"\x00\x00\x00\x03\x92\x01\x02"


async def test_a_sized_read_reports_the_bytes_the_message_took_on_the_stream() -> None:
    a, b = memory_stream_pair("/p", "a", "b")
    msgs = [{"t": "push", "r": [b"\x01" * 300]}, [1, 2]]
    for msg in msgs:
        await write_msg(a, msg)
    for msg in msgs:
        assert await read_msg_sized(b) == (msg, len(encode_msg(msg)))
