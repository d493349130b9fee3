"""An in-memory stream pair with the exact semantics of MuxStream, for tests that need no sockets."""

from __future__ import annotations

from opentela._types import PeerId, ProtocolName, Stream
from opentela.fabric._frames import INITIAL_WINDOW, MAX_FRAME_PAYLOAD
from opentela.fabric.stream import MuxStream


class _MemoryLink:
    """One end's connection: every frame is handed straight to the stream at the other end."""

    max_frame = MAX_FRAME_PAYLOAD
    write_paused = False

    def __init__(self) -> None:
        self.peer: MuxStream | None = None

    def send_data(self, stream_id: int, data: bytes | memoryview, fin: bool) -> None:
        """Hand the bytes to the other end (credit is respected by the sender, so this cannot overflow)."""
        peer = self.peer
        if peer is not None and not peer.closed:
            peer.feed_data(bytes(data), fin)

    def send_window_update(self, stream_id: int, delta: int) -> None:
        """Hand the credit to the other end."""
        if self.peer is not None and not self.peer.closed:
            self.peer.feed_window_update(delta)

    def send_reset(self, stream_id: int, code: int, message: str) -> None:
        """Reset the other end."""
        if self.peer is not None and not self.peer.closed:
            self.peer.feed_reset(code, message)

    def release_stream(self, stream_id: int) -> None:
        """Nothing to forget: the link carries one stream."""

    def flush(self) -> None:
        pass

    async def wait_writable(self) -> None:
        return None


def memory_stream_pair(
    protocol: ProtocolName, peer_a: PeerId, peer_b: PeerId, *, window: int = INITIAL_WINDOW
) -> tuple[Stream, Stream]:
    """Two connected streams: (the end held by `peer_a`, the end held by `peer_b`).

    Reads, writes, flow control, half-close and reset behave as on a MuxConnection; each end's
    `remote_peer` is the other peer.
    """
    link_a, link_b = _MemoryLink(), _MemoryLink()
    end_a = MuxStream(link_a, 1, protocol, peer_b, window)
    end_b = MuxStream(link_b, 1, protocol, peer_a, window)
    link_a.peer, link_b.peer = end_b, end_a
    end_a.open_window()
    end_b.open_window()
    return end_a, end_b
