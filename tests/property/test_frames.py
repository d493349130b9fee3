"""Frame codec laws: every frame round-trips, any chunking decodes the same, garbage never escapes ProtocolError."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ProtocolError
from opentela.fabric import _frames as fr

stream_ids = st.integers(1, fr.MAX_STREAM_ID)
u32 = st.integers(0, 0xFFFFFFFF)
protocols = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= fr.MAX_PROTOCOL_LEN)
payloads = st.binary(max_size=600)
messages = st.text(max_size=60)

frames = st.one_of(
    st.builds(
        lambda i, fin, d: fr.Frame(fr.DATA, fin, i, d), stream_ids, st.sampled_from([0, fr.FIN]), payloads
    ),
    st.builds(
        lambda i, fin, p, d: fr.Frame(fr.DATA, fr.SYN | fin, i, d, p),
        stream_ids,
        st.sampled_from([0, fr.FIN]),
        protocols,
        payloads,
    ),
    st.builds(lambda i, c, m: fr.Frame(fr.DATA, fr.RST, i, code=c, message=m), stream_ids, u32, messages),
    st.builds(
        lambda i, v: fr.Frame(fr.WINDOW_UPDATE, 0, i, value=v), stream_ids, st.integers(1, fr.MAX_WINDOW)
    ),
    st.builds(
        lambda a, v: fr.Frame(fr.PING, a, 0, value=v), st.sampled_from([0, fr.ACK]), st.integers(0, 2**64 - 1)
    ),
    st.builds(lambda c, m: fr.Frame(fr.GOAWAY, 0, 0, code=c, message=m), u32, messages),
)


def decode_all(chunks: list[bytes]) -> list[fr.Frame]:
    decoder = fr.FrameDecoder()
    out: list[fr.Frame] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    assert decoder.buffered == 0
    return out


@given(frames)
def test_every_frame_round_trips(frame: fr.Frame) -> None:
    assert fr.FrameDecoder().feed(fr.encode_frame(frame)) == [frame]


@given(st.lists(frames, max_size=12), st.data())
def test_any_chunking_decodes_the_same_frames(batch: list[fr.Frame], data: st.DataObject) -> None:
    wire = b"".join(fr.encode_frame(f) for f in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=20)))
    bounds = [0, *cuts, len(wire)]
    chunks = [wire[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_all(chunks) == batch


@given(st.lists(frames, min_size=1, max_size=5), st.data())
def test_a_truncated_stream_yields_a_prefix_and_waits(batch: list[fr.Frame], data: st.DataObject) -> None:
    wire = b"".join(fr.encode_frame(f) for f in batch)
    cut = data.draw(st.integers(0, len(wire) - 1))
    decoder = fr.FrameDecoder()
    got = decoder.feed(wire[:cut])
    assert got == batch[: len(got)] and len(got) < len(batch)
    assert decoder.feed(wire[cut:]) == batch[len(got) :]


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(1, 50))
def test_garbage_decodes_or_raises_protocol_error(garbage: bytes, step: int) -> None:
    decoder = fr.FrameDecoder(max_payload=1024)
    try:
        for i in range(0, len(garbage), step):
            for frame in decoder.feed(garbage[i : i + step]):
                # Whatever decodes is a frame the encoder could have produced.
                assert fr.encode_frame(frame)
    except ProtocolError:
        return


@settings(max_examples=300)
@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_mutated_frames_decode_or_raise_protocol_error(batch: list[fr.Frame], data: st.DataObject) -> None:
    wire = bytearray(b"".join(fr.encode_frame(f) for f in batch))
    for _ in range(data.draw(st.integers(1, 4))):
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    try:
        for frame in fr.FrameDecoder().feed(bytes(wire[:cut])):
            assert fr.encode_frame(frame)
    except ProtocolError:
        pass


@given(stream_ids, payloads, st.one_of(st.just(""), protocols), st.booleans())
def test_a_mutable_data_frame_decodes_like_encode_data(
    stream_id: int, data: bytes, protocol: str, fin_later: bool
) -> None:
    flags = fr.SYN if protocol else 0
    frame = fr.data_frame(stream_id, data, flags, fr.syn_prefix(protocol) if protocol else b"")
    if fin_later:
        fr.set_fin(frame)  # what a sender does when write_eof finds the frame still unsent
    expected = fr.Frame(fr.DATA, flags | (fr.FIN if fin_later else 0), stream_id, data, protocol)
    assert bytes(frame) == fr.encode_frame(expected)
    assert fr.FrameDecoder().feed(bytes(frame)) == [expected]
