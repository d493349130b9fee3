"""MuxStream against a recording link: what it asks the link to send, and how it judges what the link feeds it."""

from __future__ import annotations

import pytest

from opentela.errors import ProtocolError, StreamResetError
from opentela.fabric._frames import INITIAL_WINDOW, MAX_FRAME_PAYLOAD, MAX_WINDOW, ErrorCode
from opentela.fabric.stream import MuxStream


class RecordingLink:
    """A StreamLink that only writes down what the stream asked of it."""

    max_frame = MAX_FRAME_PAYLOAD
    write_paused = False

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def send_data(self, stream_id: int, data: bytes | memoryview, fin: bool) -> None:
        self.calls.append(("data", stream_id, bytes(data), fin))

    def send_window_update(self, stream_id: int, delta: int) -> None:
        self.calls.append(("window", stream_id, delta))

    def send_reset(self, stream_id: int, code: int, message: str) -> None:
        self.calls.append(("reset", stream_id, code))

    def release_stream(self, stream_id: int) -> None:
        self.calls.append(("release", stream_id))

    def flush(self) -> None:
        pass

    async def wait_writable(self) -> None:
        return None


def make(window: int = INITIAL_WINDOW) -> tuple[MuxStream, RecordingLink]:
    link = RecordingLink()
    return MuxStream(link, 7, "/p", "peer", window), link


def test_open_window_grants_only_what_exceeds_the_initial_window() -> None:
    stream, link = make(INITIAL_WINDOW * 4)
    stream.open_window()
    assert link.calls == [("window", 7, INITIAL_WINDOW * 3)]
    small, small_link = make()
    small.open_window()
    assert small_link.calls == []


async def test_writes_and_half_closes_go_to_the_link_under_the_stream_id() -> None:
    stream, link = make()
    await stream.write(b"hello")
    stream.feed_data(b"bye", True)
    await stream.write_eof()
    assert link.calls == [("data", 7, b"hello", False), ("data", 7, b"", True), ("release", 7)]
    assert stream.closed


async def test_fed_data_is_read_back_in_order() -> None:
    stream, _ = make()
    stream.feed_data(b"ab", False)
    stream.feed_data(b"cd", True)
    assert await stream.read() == b"abcd"
    assert await stream.read() == b""


def test_data_after_fin_is_a_protocol_error() -> None:
    stream, _ = make()
    stream.feed_data(b"x", True)
    with pytest.raises(ProtocolError, match="data after FIN on stream 7"):
        stream.feed_data(b"y", False)


def test_data_over_the_credit_is_a_flow_control_error() -> None:
    stream, _ = make()
    stream.feed_data(bytes(INITIAL_WINDOW), False)
    with pytest.raises(ProtocolError, match="flow-control window") as info:
        stream.feed_data(b"x", False)
    assert info.value.details["wire_code"] == ErrorCode.FLOW_CONTROL_ERROR


def test_a_window_overflow_is_a_flow_control_error() -> None:
    stream, _ = make()
    stream.feed_window_update(MAX_WINDOW - INITIAL_WINDOW)
    with pytest.raises(ProtocolError, match="overflowed") as info:
        stream.feed_window_update(1)
    assert info.value.details["wire_code"] == ErrorCode.FLOW_CONTROL_ERROR


async def test_a_fed_reset_fails_reads_and_releases_the_stream() -> None:
    stream, link = make()
    stream.feed_reset(ErrorCode.CANCEL, "gone")
    with pytest.raises(StreamResetError, match="gone"):
        await stream.read()
    assert link.calls == [("release", 7)] and stream.closed


async def test_a_reset_after_fin_keeps_what_arrived_readable() -> None:
    stream, _ = make()
    stream.feed_data(b"all of it", True)
    stream.feed_reset(ErrorCode.CANCEL, "late")
    assert await stream.read() == b"all of it"


async def test_read_all_nowait_gives_everything_only_once_the_peer_has_finished() -> None:
    stream, _ = make()
    stream.feed_data(b"ab", False)
    assert stream.read_all_nowait() is None  # still arriving: nothing taken
    stream.feed_data(b"cd", True)
    assert stream.read_all_nowait() == b"abcd"
    assert stream.read_all_nowait() == b"" and await stream.read() == b""


async def test_write_last_nowait_sends_data_and_the_end_in_one_frame_or_nothing() -> None:
    stream, link = make()
    assert stream.write_last_nowait(b"x" * (INITIAL_WINDOW + 1)) is False  # over the peer's credit
    assert link.calls == []
    stream.feed_data(b"request", True)
    assert stream.write_last_nowait(b"answer") is True
    assert link.calls == [("data", 7, b"answer", True), ("release", 7)]
    assert stream.write_last_nowait(b"more") is False  # already half-closed
