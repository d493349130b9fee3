"""The fabric's frame codec (sans-IO): encode frames to bytes and decode a byte stream into frames.

Every frame is a 12-byte header followed by `length` payload bytes (see docs/protocol.md):

    version u8 | type u8 | flags u16 | stream id u32 | length u32      (big-endian)

DATA carries stream bytes; with SYN its payload starts with the protocol name (u8 length, utf-8), and with RST it
is a u32 error code and a utf-8 message instead of data. WINDOW_UPDATE grants a u32 credit. PING carries an opaque
u64 (ACK marks the reply). GOAWAY (stream 0) carries a u32 code and a utf-8 message.
"""

from __future__ import annotations

import enum
import functools
import struct
from typing import NamedTuple

from opentela.errors import ProtocolError

VERSION = 1
HEADER = struct.Struct(">BBHII")
HEADER_SIZE = HEADER.size
MAX_FRAME_PAYLOAD = 256 * 1024
"""The largest payload any peer must accept; a longer frame is a protocol error."""
MAX_PROTOCOL_LEN = 255
MAX_STREAM_ID = 0xFFFFFFFF
MAX_WINDOW = 0xFFFFFFFF
INITIAL_WINDOW = 256 * 1024
"""Credit every stream starts with in each direction, before any WINDOW_UPDATE."""

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class FrameType(enum.IntEnum):
    """What a frame carries."""

    DATA = 0
    WINDOW_UPDATE = 1
    PING = 2
    GOAWAY = 3


# Flags, a bit set in the header's u16.
SYN = 0x1
ACK = 0x2
FIN = 0x4
RST = 0x8
_KNOWN_FLAGS = SYN | ACK | FIN | RST

DATA = FrameType.DATA
WINDOW_UPDATE = FrameType.WINDOW_UPDATE
PING = FrameType.PING
GOAWAY = FrameType.GOAWAY


class ErrorCode(enum.IntEnum):
    """Codes the fabric itself puts in RST and GOAWAY frames; 0x100 and above belong to applications."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    REFUSED_STREAM = 4
    CANCEL = 5
    UNKNOWN_PROTOCOL = 6
    DUPLICATE_CONNECTION = 7
    KEEPALIVE_TIMEOUT = 8


class Frame(NamedTuple):
    """One decoded frame; which fields mean something depends on type and flags."""

    type: int
    flags: int
    stream_id: int
    data: bytes = b""
    """DATA: the stream bytes (after the protocol name on SYN)."""
    protocol: str = ""
    """DATA with SYN: the protocol the stream speaks."""
    code: int = 0
    """DATA with RST, GOAWAY: the error code."""
    message: str = ""
    """DATA with RST, GOAWAY: a human-readable reason."""
    value: int = 0
    """WINDOW_UPDATE: the credit granted; PING: the opaque value echoed back."""


# --- encoding ---------------------------------------------------------------------------------------------


def encode_header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    """The 12-byte header of a frame (a sender writes a large payload after it without copying it)."""
    return HEADER.pack(VERSION, ftype, flags, stream_id, length)


def data_frame(stream_id: int, data: bytes | memoryview, flags: int = 0, prefix: bytes = b"") -> bytearray:
    """A DATA frame (`prefix` is a SYN's `syn_prefix`) in a mutable buffer, so FIN can still be added."""
    frame = bytearray(HEADER.pack(VERSION, DATA, flags, stream_id, len(prefix) + len(data)))
    if prefix:
        frame += prefix
    frame += data
    return frame


_FLAGS_LOW_BYTE = (
    3  # version u8, type u8, then the big-endian u16 flags: SYN, ACK, FIN and RST sit in its low byte
)


def set_fin(frame: bytearray) -> None:
    """Add FIN to a frame built by `data_frame` that has not been sent yet (saves an empty FIN frame)."""
    frame[_FLAGS_LOW_BYTE] |= FIN


@functools.lru_cache(maxsize=256)
def syn_prefix(protocol: str) -> bytes:
    """The start of a SYN payload: the protocol name, length-prefixed; ValueError if it cannot be sent."""
    raw = protocol.encode()
    if not 0 < len(raw) <= MAX_PROTOCOL_LEN:
        raise ValueError(f"protocol name must be 1-{MAX_PROTOCOL_LEN} utf-8 bytes, got {len(raw)}")
    return bytes((len(raw),)) + raw


def encode_data(stream_id: int, data: bytes = b"", flags: int = 0, protocol: str = "") -> bytes:
    """A DATA frame; pass `protocol` together with the SYN flag to open the stream."""
    if flags & SYN:
        data = syn_prefix(protocol) + data
    return HEADER.pack(VERSION, DATA, flags, stream_id, len(data)) + data


def encode_rst(stream_id: int, code: int, message: str = "") -> bytes:
    """A DATA|RST frame aborting the stream."""
    payload = _U32.pack(code) + message.encode()
    return HEADER.pack(VERSION, DATA, RST, stream_id, len(payload)) + payload


def encode_window_update(stream_id: int, delta: int) -> bytes:
    """Grant `delta` more bytes of credit on a stream."""
    return HEADER.pack(VERSION, WINDOW_UPDATE, 0, stream_id, 4) + _U32.pack(delta)


def encode_ping(value: int, ack: bool = False) -> bytes:
    """A keepalive probe, or (ack=True) the answer to one."""
    return HEADER.pack(VERSION, PING, ACK if ack else 0, 0, 8) + _U64.pack(value)


def encode_goaway(code: int, message: str = "") -> bytes:
    """Tell the peer this connection takes no new streams."""
    payload = _U32.pack(code) + message.encode()
    return HEADER.pack(VERSION, GOAWAY, 0, 0, len(payload)) + payload


def encode_frame(frame: Frame) -> bytes:
    """Encode any frame; ValueError if the frame could not be decoded back (bad fields)."""
    if not 0 <= frame.stream_id <= MAX_STREAM_ID or frame.flags & ~_KNOWN_FLAGS:
        raise ValueError(f"bad stream id or flags in {frame!r}")
    if frame.type == DATA:
        if frame.flags & RST:
            if frame.flags & (SYN | FIN | ACK):
                raise ValueError("RST cannot be combined with SYN, FIN or ACK")
            out = encode_rst(frame.stream_id, frame.code, frame.message)
        elif frame.flags & ACK:
            raise ValueError("ACK is only defined on PING")
        else:
            out = encode_data(frame.stream_id, frame.data, frame.flags, frame.protocol)
        if frame.stream_id == 0:
            raise ValueError("DATA needs a stream id")
    elif frame.type == WINDOW_UPDATE:
        if frame.stream_id == 0 or frame.flags or not 0 < frame.value <= MAX_WINDOW:
            raise ValueError(f"bad WINDOW_UPDATE {frame!r}")
        out = encode_window_update(frame.stream_id, frame.value)
    elif frame.type == PING:
        if frame.stream_id or frame.flags & ~ACK:
            raise ValueError(f"bad PING {frame!r}")
        out = encode_ping(frame.value, bool(frame.flags & ACK))
    elif frame.type == GOAWAY:
        if frame.stream_id or frame.flags:
            raise ValueError(f"bad GOAWAY {frame!r}")
        out = encode_goaway(frame.code, frame.message)
    else:
        raise ValueError(f"unknown frame type {frame.type}")
    if len(out) - HEADER_SIZE > MAX_FRAME_PAYLOAD:
        raise ValueError(f"payload over {MAX_FRAME_PAYLOAD} bytes")
    return out


# --- decoding ---------------------------------------------------------------------------------------------


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not valid utf-8") from None


def _parse(ftype: int, flags: int, stream_id: int, payload: bytes) -> Frame:
    """Validate one frame's header fields against its payload and build the Frame."""
    if ftype == DATA:
        if stream_id == 0:
            raise ProtocolError("DATA frame on stream 0")
        if flags & RST:
            if flags & (SYN | FIN | ACK):
                raise ProtocolError("RST combined with SYN, FIN or ACK")
            if len(payload) < 4:
                raise ProtocolError("RST payload shorter than its error code")
            return Frame(
                DATA,
                flags,
                stream_id,
                code=_U32.unpack_from(payload)[0],
                message=_text(payload[4:], "RST message"),
            )
        if flags & ACK:
            raise ProtocolError("ACK flag on a DATA frame")
        if flags & SYN:
            name_len = payload[0] if payload else 0
            if name_len == 0 or len(payload) < 1 + name_len:
                raise ProtocolError("SYN frame without a complete protocol name")
            protocol = _text(payload[1 : 1 + name_len], "protocol name")
            return Frame(DATA, flags, stream_id, payload[1 + name_len :], protocol)
        return Frame(DATA, flags, stream_id, payload)
    if ftype == WINDOW_UPDATE:
        if stream_id == 0 or flags or len(payload) != 4:
            raise ProtocolError("malformed WINDOW_UPDATE frame")
        delta = _U32.unpack(payload)[0]
        if delta == 0:
            raise ProtocolError("WINDOW_UPDATE of zero")
        return Frame(WINDOW_UPDATE, 0, stream_id, value=delta)
    if ftype == PING:
        if stream_id or flags & ~ACK or len(payload) != 8:
            raise ProtocolError("malformed PING frame")
        return Frame(PING, flags, 0, value=_U64.unpack(payload)[0])
    if ftype == GOAWAY:
        if stream_id or flags or len(payload) < 4:
            raise ProtocolError("malformed GOAWAY frame")
        return Frame(
            GOAWAY, 0, 0, code=_U32.unpack_from(payload)[0], message=_text(payload[4:], "GOAWAY message")
        )
    raise ProtocolError(f"unknown frame type {ftype}")


class FrameDecoder:
    """Feed it bytes as they arrive; it returns the complete frames and keeps the rest.

    A malformed frame raises ProtocolError (frames decoded earlier in the same call are dropped with it: the
    connection is lost anyway), and every later feed raises it again.
    """

    __slots__ = ("_buf", "_error", "_max_payload", "_need")

    def __init__(self, max_payload: int = MAX_FRAME_PAYLOAD) -> None:
        self._buf = bytearray()
        self._need = 0  # bytes the buffer must hold before the frame at its start is complete
        self._max_payload = max_payload
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Decode every complete frame in what was buffered plus `data`."""
        if self._error is not None:
            raise self._error
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return []  # a large frame arriving in pieces: no re-parsing, no quadratic copying
            data = bytes(self._buf)
            self._buf.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        self._need = 0
        frames: list[Frame] = []
        pos, end = 0, len(data)
        try:
            while end - pos >= HEADER_SIZE:
                version, ftype, flags, stream_id, length = HEADER.unpack_from(data, pos)
                if version != VERSION:
                    raise ProtocolError(f"unsupported frame version {version}")
                if flags & ~_KNOWN_FLAGS:
                    raise ProtocolError(f"unknown flags {flags:#x}")
                if length > self._max_payload:
                    raise ProtocolError(f"frame payload of {length} bytes is over {self._max_payload}")
                if ftype > GOAWAY:
                    raise ProtocolError(f"unknown frame type {ftype}")
                start = pos + HEADER_SIZE
                if end - start < length:
                    self._need = HEADER_SIZE + length
                    break
                payload = data[start : start + length]
                pos = start + length
                if ftype == DATA and not flags & (SYN | RST | ACK):
                    # The hot path (plain stream bytes), checked inline.
                    if stream_id == 0:
                        raise ProtocolError("DATA frame on stream 0")
                    frames.append(Frame(DATA, flags, stream_id, payload))
                else:
                    frames.append(_parse(ftype, flags, stream_id, payload))
        except ProtocolError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        if pos < end:
            self._buf += memoryview(data)[pos:]
        return frames
