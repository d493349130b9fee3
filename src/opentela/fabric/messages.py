"""Length-prefixed msgpack messages on a stream: the framing of gossip and control protocols."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

from opentela._types import Stream
from opentela.errors import ProtocolError

DEFAULT_MAX_SIZE = 4 * 1024 * 1024
_LEN = struct.Struct(">I")


def encode_msg(obj: Any, max_size: int = DEFAULT_MAX_SIZE) -> bytes:
    """u32 big-endian length + msgpack of `obj`; ProtocolError if over `max_size`."""
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > max_size:
        raise ProtocolError(f"message of {len(body)} bytes is over the {max_size} byte limit")
    return _LEN.pack(len(body)) + body


async def write_msg(stream: Stream, obj: Any, max_size: int = DEFAULT_MAX_SIZE) -> None:
    """Send one message (header and body in a single write)."""
    await stream.write(encode_msg(obj, max_size))


async def read_msg(stream: Stream, max_size: int = DEFAULT_MAX_SIZE) -> Any:
    """Receive one message.

    End of stream before a message: asyncio.IncompleteReadError (with an empty `partial`), so a reader loop
    can stop cleanly. End of stream inside a message, a length over `max_size` or bad msgpack: ProtocolError.
    """
    return (await read_msg_sized(stream, max_size))[0]


async def read_msg_sized(stream: Stream, max_size: int = DEFAULT_MAX_SIZE) -> tuple[Any, int]:
    """Receive one message, with the bytes it took on the stream (header included), as `read_msg`."""
    header = await _read_header(stream)
    (length,) = _LEN.unpack(header)
    if length > max_size:
        raise ProtocolError(f"message of {length} bytes is over the {max_size} byte limit")
    try:
        body = await stream.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(f"stream ended {len(exc.partial)} bytes into a {length} byte message") from None
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False), _LEN.size + length
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed message: {exc}") from exc


async def _read_header(stream: Stream) -> bytes:
    try:
        return await stream.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("stream ended inside a message header") from None
        raise
