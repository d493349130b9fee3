"""The /otela/blocks/1 codec: every frame round-trips, and any byte string either decodes or fails cleanly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ProtocolError
from opentela.fabric.block_frames import DTYPES, MAX_HEAD_BYTES, Frame, encode_frame, read_frame, tensor_head
from opentela.fabric.memory import memory_stream_pair

heads = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: k not in ("op", "n")),
    st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=30), st.booleans(), st.none()),
    max_size=6,
)


def decode_all(data: bytes, max_payload: int = 1 << 20) -> list[Frame]:
    """Every frame in `data`, read back through a real in-memory stream."""

    async def go() -> list[Frame]:
        ours, theirs = memory_stream_pair("/otela/blocks/1", "a", "b")
        await ours.write(data)
        await ours.write_eof()
        frames = []
        while (frame := await read_frame(theirs, max_payload)) is not None:
            frames.append(frame)
        return frames

    return asyncio.run(go())


@given(st.text(min_size=1, max_size=10), heads, st.binary(max_size=4096))
@settings(max_examples=200, deadline=None)
def test_any_frame_round_trips(op: str, head: dict, payload: bytes) -> None:
    (frame,) = decode_all(encode_frame(op, head, payload))
    assert frame.op == op and frame.payload == payload
    assert {k: v for k, v in frame.head.items() if k not in ("op", "n")} == head


@given(
    st.sampled_from(sorted(DTYPES)),
    st.lists(st.integers(1, 9), min_size=1, max_size=3),
    st.integers(0, 3),
)
@settings(max_examples=100, deadline=None)
def test_tensor_shapes_are_checked_against_their_payload(dtype: str, shape: list[int], skew: int) -> None:
    count = int(np.prod(shape))
    payload = np.arange(count, dtype=np.float32 if dtype == "f4" else np.float16).tobytes()
    payload += b"\0" * skew
    (frame,) = decode_all(encode_frame("step", tensor_head(dtype, tuple(shape)), payload))
    if skew:
        with pytest.raises(ProtocolError):
            frame.shape(1 << 20)
    else:
        assert frame.shape(1 << 20) == tuple(shape)
        with pytest.raises(ProtocolError):
            frame.shape(count - 1)  # over the reader's element limit


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_decodes_or_fails_with_a_protocol_error(data: bytes) -> None:
    try:
        frames = decode_all(data, max_payload=64)
    except ProtocolError:
        return
    assert all(isinstance(f, Frame) and len(f.payload) <= 64 for f in frames)


def test_limits() -> None:
    with pytest.raises(ProtocolError):
        encode_frame("open", {"s": "x" * (MAX_HEAD_BYTES + 1)})
    big = encode_frame("step", tensor_head("f4", (1, 4)), b"\0" * 16)
    with pytest.raises(ProtocolError):
        decode_all(big, max_payload=15)
    for bad in (
        {"d": "f8", "sh": [1]},
        {"d": "f4", "sh": []},
        {"d": "f4", "sh": [0, 4]},
        {"d": "f4", "sh": "x"},
    ):
        (frame,) = decode_all(encode_frame("step", bad, b"\0" * 4))
        with pytest.raises(ProtocolError):
            frame.shape(100)
    truncated = encode_frame("step", tensor_head("f4", (1, 4)), b"\0" * 16)[:-3]
    with pytest.raises(ProtocolError):
        decode_all(truncated)
