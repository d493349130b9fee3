"""The /otela/blocks/1 codec: session control and hidden-state tensors between a chain client and block servers.

Every frame is ``u32 head length | msgpack head | n payload bytes``; the head says what the frame is (``op``) and
how many raw bytes follow (``n``, 0 when absent). Tensors travel as raw little-endian bytes named by a dtype and a
shape in the head, never as JSON or msgpack lists, so a hidden state costs its own size on the wire and is read
into an array without a copy.

Client -> server, on the session's own stream:
  ``open``  {s: session, m: model, a: first block, e: end block, L: max tokens, r: request id, x: next hop?}
  ``step``  {i: step, d: dtype, sh: shape} + tensor: run blocks [a, e) on it (or, with a next hop, pass it on)
Server -> client:
  ``ready`` {a, e, c: cache bytes reserved, f: cache bytes free}
  ``out``   {i, d, sh, us: compute microseconds} + tensor
  ``error`` {code, message}: the session cannot go on (the server closes the stream after it)
Server -> next server (server-to-server forwarding), on a stream the first server opens:
  ``relay`` {s: session} once, then ``step`` frames for that session.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from opentela._types import Stream
from opentela.errors import ProtocolError

MAX_HEAD_BYTES = 8 * 1024
_LEN = struct.Struct(">I")
DTYPES = {"f4": 4, "f2": 2}
"""Tensor element types the protocol carries, with their sizes in bytes."""

# Stream reset codes (application range, like http_tunnel's): why a server gave a session up.
RESET_BAD_FRAME = 0x110
RESET_SERVER_STOPPING = 0x111
RESET_SESSION_EVICTED = 0x112


@dataclass(slots=True)
class Frame:
    """One decoded frame: its head and the raw bytes that followed it."""

    op: str
    head: dict[str, Any]
    payload: bytes = b""

    def shape(self, max_elements: int) -> tuple[int, ...]:
        """The tensor shape the head announces, checked against the payload's size; ProtocolError if they differ."""
        shape, dtype = self.head.get("sh"), self.head.get("d")
        if dtype not in DTYPES:
            raise ProtocolError(f"unknown tensor dtype {dtype!r}")
        if not isinstance(shape, list) or not shape or not all(isinstance(n, int) and n > 0 for n in shape):
            raise ProtocolError(f"bad tensor shape {shape!r}")
        elements = 1
        for n in shape:
            elements *= n
        if elements > max_elements or elements * DTYPES[dtype] != len(self.payload):
            raise ProtocolError(f"tensor of shape {shape} does not match its {len(self.payload)} bytes")
        return tuple(shape)


def encode_frame(op: str, head: dict[str, Any] | None = None, payload: bytes | memoryview = b"") -> bytes:
    """One frame ready to write: the head (with ``op`` and ``n``) followed by `payload`."""
    body = {"op": op, **(head or {})}
    size = memoryview(payload).nbytes
    if size:
        body["n"] = size
    packed = msgpack.packb(body, use_bin_type=True)
    if len(packed) > MAX_HEAD_BYTES:
        raise ProtocolError(f"frame head of {len(packed)} bytes is over the {MAX_HEAD_BYTES} byte limit")
    return b"".join((_LEN.pack(len(packed)), packed, payload))


def tensor_head(dtype: str, shape: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    """The head fields describing a tensor payload."""
    return {"d": dtype, "sh": list(shape), **extra}


async def read_frame(stream: Stream, max_payload: int) -> Frame | None:
    """The next frame, or None when the peer half-closed between frames; ProtocolError on anything malformed."""
    try:
        raw_len = await stream.readexactly(_LEN.size)
    except EOFError as exc:  # asyncio.IncompleteReadError
        if getattr(exc, "partial", b""):
            raise ProtocolError("stream ended inside a frame header") from None
        return None
    (length,) = _LEN.unpack(raw_len)
    if length > MAX_HEAD_BYTES:
        raise ProtocolError(f"frame head of {length} bytes is over the {MAX_HEAD_BYTES} byte limit")
    try:
        head = msgpack.unpackb(await stream.readexactly(length), raw=False)
    except EOFError:
        raise ProtocolError("stream ended inside a frame head") from None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"malformed frame head: {exc}") from exc
    if not isinstance(head, dict) or not isinstance(head.get("op"), str):
        raise ProtocolError("frame head is not a map with an op")
    size = head.get("n", 0)
    if not isinstance(size, int) or not 0 <= size <= max_payload:
        raise ProtocolError(f"frame payload of {size!r} bytes is invalid or over {max_payload}")
    try:
        payload = await stream.readexactly(size) if size else b""
    except EOFError:
        raise ProtocolError("stream ended inside a frame payload") from None
    return Frame(head["op"], head, payload)
