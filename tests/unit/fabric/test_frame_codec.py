"""The frame codec rejects each kind of malformed frame with ProtocolError and decodes the valid ones."""

from __future__ import annotations

import struct

import pytest

from opentela.errors import ProtocolError
from opentela.fabric import _frames as fr


def raw(version: int = 1, ftype: int = 0, flags: int = 0, stream_id: int = 1, payload: bytes = b"") -> bytes:
    return struct.pack(">BBHII", version, ftype, flags, stream_id, len(payload)) + payload


@pytest.mark.parametrize(
    ("wire", "needle"),
    [
        (raw(version=2), "version"),
        (raw(ftype=9), "type"),
        (raw(flags=0x10), "flags"),
        (struct.pack(">BBHII", 1, 0, 0, 1, fr.MAX_FRAME_PAYLOAD + 1), "over"),
        (raw(stream_id=0, payload=b"x"), "stream 0"),
        (raw(flags=fr.SYN, payload=b""), "protocol name"),
        (raw(flags=fr.SYN, payload=b"\x05ab"), "protocol name"),
        (raw(flags=fr.SYN, payload=b"\x02\xff\xfe"), "utf-8"),
        (raw(flags=fr.SYN | fr.RST, payload=b"\0\0\0\0"), "RST"),
        (raw(flags=fr.RST, payload=b"\0\0"), "RST"),
        (raw(flags=fr.RST, payload=b"\0\0\0\1\xff"), "utf-8"),
        (raw(flags=fr.ACK, payload=b"x"), "ACK"),
        (raw(ftype=fr.WINDOW_UPDATE, payload=b"\0\0\0\0"), "zero"),
        (raw(ftype=fr.WINDOW_UPDATE, payload=b"\0\0\1"), "WINDOW_UPDATE"),
        (raw(ftype=fr.WINDOW_UPDATE, stream_id=0, payload=b"\0\0\0\1"), "WINDOW_UPDATE"),
        (raw(ftype=fr.PING, stream_id=3, payload=bytes(8)), "PING"),
        (raw(ftype=fr.PING, stream_id=0, payload=bytes(7)), "PING"),
        (raw(ftype=fr.GOAWAY, stream_id=0, payload=b"\0"), "GOAWAY"),
        (raw(ftype=fr.GOAWAY, stream_id=0, flags=fr.FIN, payload=bytes(4)), "GOAWAY"),
    ],
)
def test_malformed_frames_raise_protocol_error(wire: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        fr.FrameDecoder().feed(wire)


def test_the_error_is_sticky() -> None:
    decoder = fr.FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(raw(version=7))
    with pytest.raises(ProtocolError):
        decoder.feed(fr.encode_ping(1))


def test_oversize_is_caught_from_the_header_alone() -> None:
    # The decoder must not wait for (or buffer) a huge payload before refusing it.
    with pytest.raises(ProtocolError):
        fr.FrameDecoder(max_payload=1024).feed(struct.pack(">BBHII", 1, 0, 0, 1, 4096))


def test_syn_carries_protocol_and_first_data() -> None:
    wire = fr.encode_data(7, b"hello", fr.SYN | fr.FIN, "/otela/http/1")
    (frame,) = fr.FrameDecoder().feed(wire)
    assert (frame.protocol, frame.data, frame.flags) == ("/otela/http/1", b"hello", fr.SYN | fr.FIN)
    assert len(wire) == fr.HEADER_SIZE + 1 + len("/otela/http/1") + 5


def test_large_frame_in_small_pieces() -> None:
    payload = bytes(range(256)) * 1000
    wire = fr.encode_data(1, payload) + fr.encode_ping(5)
    decoder = fr.FrameDecoder()
    frames = []
    for i in range(0, len(wire), 1000):
        frames += decoder.feed(wire[i : i + 1000])
    assert frames == [fr.Frame(fr.DATA, 0, 1, payload), fr.Frame(fr.PING, 0, 0, value=5)]


@pytest.mark.parametrize(
    "frame",
    [
        fr.Frame(fr.DATA, fr.ACK, 1),
        fr.Frame(fr.DATA, 0, 0, b"x"),
        fr.Frame(fr.DATA, fr.RST | fr.FIN, 1),
        fr.Frame(fr.WINDOW_UPDATE, 0, 1, value=0),
        fr.Frame(fr.PING, 0, 2),
        fr.Frame(fr.DATA, fr.SYN, 1, protocol="x" * 300),
    ],
)
def test_encoder_refuses_frames_that_would_not_decode(frame: fr.Frame) -> None:
    with pytest.raises(ValueError):
        fr.encode_frame(frame)
