"""The /otela/http/1 codec over in-memory streams: round trips, limits, and garbage."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela._types import PROTO_HTTP
from opentela.errors import ProtocolError
from opentela.fabric.http_tunnel import (
    MAX_HEAD_BYTES,
    TunnelRequest,
    TunnelResponseHead,
    decode_request,
    encode_request,
    encode_response_head,
    read_request,
    read_response_head,
)
from opentela.fabric.identity import Identity
from opentela.fabric.memory import memory_stream_pair

A, B = Identity.generate().peer_id, Identity.generate().peer_id


async def feed(data: bytes):
    ours, theirs = memory_stream_pair(PROTO_HTTP, A, B)
    await ours.write(data)
    await ours.write_eof()
    return theirs


@given(
    st.sampled_from(["POST", "GET"]),
    st.sampled_from(["/v1/chat/completions", "/v1/models"]),
    st.binary(max_size=2048),
    st.text(min_size=1, max_size=40),
    st.dictionaries(st.sampled_from(["content-type", "accept"]), st.text(max_size=30)),
    st.booleans(),
)
async def test_request_round_trip(
    method: str, path: str, body: bytes, rid: str, headers: dict, timing: bool
) -> None:
    stream = await feed(encode_request(TunnelRequest(method, path, body, rid, headers, timing)))
    got = await read_request(stream, max_body=4096)
    assert (got.method, got.path, got.body, got.request_id, got.headers, got.timing) == (
        method,
        path,
        body,
        rid,
        headers,
        timing,
    )
    whole = decode_request(encode_request(TunnelRequest(method, path, body, rid, headers, timing)), 4096)
    assert whole == got


@given(
    st.integers(100, 599),
    st.dictionaries(st.sampled_from(["content-type"]), st.text(max_size=30)),
    st.one_of(st.none(), st.integers(0, 2**40)),
    st.one_of(st.none(), st.integers(-(2**20), 2**40)),
)
async def test_response_head_round_trip(
    status: int, headers: dict, engine_us: int | None, node_us: int | None
) -> None:
    head_out = TunnelResponseHead(status, headers, "engine_crashed", engine_us, node_us)
    stream = await feed(encode_response_head(head_out) + b"body")
    head = await read_response_head(stream)
    assert (head.status, head.headers, head.error_code, head.engine_us, head.node_us) == (
        status,
        headers,
        "engine_crashed",
        engine_us,
        node_us,
    )
    assert await stream.read() == b"body"


async def test_body_over_limit_is_refused() -> None:
    stream = await feed(encode_request(TunnelRequest("POST", "/v1/completions", b"x" * 100, "r")))
    with pytest.raises(ProtocolError, match="over"):
        await read_request(stream, max_body=99)


async def test_head_over_limit_is_refused_before_reading_it() -> None:
    stream = await feed(struct.pack(">I", MAX_HEAD_BYTES + 1))
    with pytest.raises(ProtocolError, match="limit"):
        await read_request(stream, max_body=10)


@pytest.mark.parametrize(
    "head",
    [
        [1, 2, 3],
        {"m": "POST", "p": "no-slash", "r": "x", "b": 0},
        {"m": "POST", "p": "/v1/x", "r": "x", "b": -1},
        {"m": "POST", "p": "/v1/x", "r": "x"},
        {"m": "POST", "p": "/v1/x", "r": "x", "b": 0, "h": {"a": 1}},
    ],
)
async def test_malformed_request_heads_raise_protocol_error(head: object) -> None:
    raw = msgpack.packb(head)
    stream = await feed(struct.pack(">I", len(raw)) + raw)
    with pytest.raises(ProtocolError):
        await read_request(stream, max_body=10)


@given(st.binary(max_size=64))
async def test_garbage_raises_only_protocol_or_incomplete_read(data: bytes) -> None:
    stream = await feed(data)
    try:
        await read_request(stream, max_body=1024)
    except (ProtocolError, asyncio.IncompleteReadError):
        pass


@given(st.binary(max_size=96), st.integers(0, 64))
async def test_a_whole_request_decodes_exactly_as_it_reads(data: bytes, max_body: int) -> None:
    """decode_request (the serving node's no-wait path) accepts what read_request accepts from a stream that ends
    there, refuses the rest with ProtocolError, and never takes a request with bytes left over."""
    stream = await feed(data)
    try:
        read = await read_request(stream, max_body=max_body)
        leftover = await stream.read()
    except (ProtocolError, asyncio.IncompleteReadError):
        read, leftover = None, b""
    try:
        decoded = decode_request(data, max_body)
    except ProtocolError:
        decoded = None
    assert decoded == (read if not leftover else None)


@pytest.mark.parametrize("extra", [b"", b"x"])
async def test_a_request_cut_short_or_with_bytes_after_it_is_refused_whole(extra: bytes) -> None:
    raw = encode_request(TunnelRequest("POST", "/v1/completions", b"body", "r"))
    with pytest.raises(ProtocolError):
        decode_request(raw[:-1] + extra if not extra else raw + extra, max_body=10)
