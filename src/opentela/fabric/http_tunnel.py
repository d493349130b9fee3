"""The /otela/http/1 codec: an HTTP request and its response carried over one multiplexed stream.

Request:  u32 head length | msgpack head {m, p, h, r, b, t?} | b bytes of body | half-close.
Response: u32 head length | msgpack head {s, h, e?, t?} | body bytes as the engine produces them | half-close.
A request with ``t: 1`` asks for timing; its response head then carries ``t``: the engine's time in microseconds, and
``n``: the serving node's own time before and after it (until the head was written), in microseconds.
A failure after the response head resets the stream with one of the RESET_* codes below.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from opentela._types import Stream
from opentela.errors import ProtocolError

MAX_HEAD_BYTES = 16 * 1024
_LEN = struct.Struct(">I")

# Stream reset codes (application range, 0x100 and up; lower codes belong to the fabric).
RESET_BAD_REQUEST = 0x100
RESET_ENGINE_CRASHED = 0x101
RESET_ENGINE_TIMEOUT = 0x102
RESET_CANCELLED = 0x103

# Only these request headers travel: the engine needs nothing else, and every byte is on the hot path.
FORWARDED_REQUEST_HEADERS = ("content-type", "accept")
FORWARDED_RESPONSE_HEADERS = ("content-type",)
MODEL_HEADER = "x-otela-model"
"""Names the model a tunnelled request was routed for, so a node running several engines picks the one serving it
(without parsing the body)."""


@dataclass(slots=True)
class TunnelRequest:
    """An HTTP request as the serving node receives it."""

    method: str
    path: str
    body: bytes
    request_id: str
    headers: dict[str, str] = field(default_factory=dict)
    timing: bool = False
    """Ask the serving node to report how long its engine took (``engine_us`` in the response head)."""


@dataclass(slots=True)
class TunnelResponseHead:
    """Status and headers of a tunnelled response; `error_code` names an OpenTela error when the node failed it."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None
    engine_us: int | None = None
    """Microseconds the engine took to answer, when the request asked for timing."""
    node_us: int | None = None
    """Microseconds the serving node spent on the request outside the engine, up to writing this head."""


def _pack_head(obj: dict[str, Any]) -> bytes:
    head = msgpack.packb(obj, use_bin_type=True)
    return _LEN.pack(len(head)) + head


def _head_length(raw_len: bytes) -> int:
    (length,) = _LEN.unpack(raw_len)
    if length > MAX_HEAD_BYTES:
        raise ProtocolError(f"tunnel head of {length} bytes is over the {MAX_HEAD_BYTES} byte limit")
    return int(length)


def _unpack_head(raw: bytes) -> dict[Any, Any]:
    try:
        head = msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"malformed tunnel head: {exc}") from exc
    if not isinstance(head, dict):
        raise ProtocolError("tunnel head is not a map")
    return head


async def _read_head(stream: Stream) -> dict[Any, Any]:
    length = _head_length(await stream.readexactly(4))
    return _unpack_head(await stream.readexactly(length))


def encode_request(req: TunnelRequest) -> bytes:
    """Head and body of a request, ready to write in one go."""
    head = {"m": req.method, "p": req.path, "r": req.request_id, "b": len(req.body)}
    if req.headers:
        head["h"] = req.headers
    if req.timing:
        head["t"] = 1
    return _pack_head(head) + req.body


async def read_request(stream: Stream, max_body: int) -> TunnelRequest:
    """Read one tunnelled request; ProtocolError if it is malformed or over `max_body`."""
    head = await _read_head(stream)
    body_len = _request_body_length(head, max_body)
    body = await stream.readexactly(body_len) if body_len else b""
    return _request(head, body)


def decode_request(data: bytes, max_body: int) -> TunnelRequest:
    """A whole tunnelled request from its bytes (the stream's every byte, as `read_all_nowait` gives them);
    ProtocolError if it is malformed, over `max_body`, or not exactly one request."""
    if len(data) < 4:
        raise ProtocolError("tunnel request ends inside its head length")
    length = _head_length(data[:4])
    if len(data) < 4 + length:
        raise ProtocolError("tunnel request ends inside its head")
    head = _unpack_head(data[4 : 4 + length])
    body_len = _request_body_length(head, max_body)
    if len(data) - 4 - length != body_len:
        raise ProtocolError(
            f"tunnel request body is {len(data) - 4 - length} bytes, its head says {body_len}"
        )
    return _request(head, data[4 + length :])


def _request_body_length(head: dict[Any, Any], max_body: int) -> int:
    """The body length a request head announces, once the head is checked."""
    try:
        method, path, _request_id, body_len = head["m"], head["p"], head["r"], head["b"]
        headers = head.get("h", {})
    except KeyError as exc:
        raise ProtocolError(f"tunnel request head lacks {exc}") from None
    if not (isinstance(method, str) and isinstance(path, str) and path.startswith("/")):
        raise ProtocolError("tunnel request head has a bad method or path")
    if not isinstance(body_len, int) or not 0 <= body_len <= max_body:
        raise ProtocolError(f"tunnel request body length {body_len!r} is invalid or over {max_body}")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ProtocolError("tunnel request headers must map strings to strings")
    return body_len


def _request(head: dict[Any, Any], body: bytes) -> TunnelRequest:
    return TunnelRequest(head["m"], head["p"], body, str(head["r"]), head.get("h", {}), bool(head.get("t")))


def encode_response_head(head: TunnelResponseHead) -> bytes:
    """The response head, to be followed by the body bytes."""
    obj: dict[str, Any] = {"s": head.status}
    if head.headers:
        obj["h"] = head.headers
    if head.error_code:
        obj["e"] = head.error_code
    if head.engine_us is not None:
        obj["t"] = head.engine_us
    if head.node_us is not None:
        obj["n"] = head.node_us
    return _pack_head(obj)


async def read_response_head(stream: Stream) -> TunnelResponseHead:
    """Read the response head; the body follows on the same stream."""
    head = await _read_head(stream)
    status, headers, error_code = head.get("s"), head.get("h", {}), head.get("e")
    if not isinstance(status, int) or not 100 <= status <= 599 or not isinstance(headers, dict):
        raise ProtocolError("tunnel response head is malformed")
    engine_us, node_us = head.get("t"), head.get("n")
    return TunnelResponseHead(
        status,
        {str(k): str(v) for k, v in headers.items()},
        error_code,
        engine_us if isinstance(engine_us, int) else None,
        node_us if isinstance(node_us, int) else None,
    )
