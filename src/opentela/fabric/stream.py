"""One multiplexed stream: buffered reads, credit-limited writes, half-close and reset.

A MuxStream does no I/O itself. It hands frames to its link (a MuxConnection, or the in-memory link of
memory.py) through the `StreamLink` methods, and the link feeds it what the peer sent through the `feed_*`
methods, so both transports share exactly these semantics and neither touches the other's fields.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from opentela._types import PeerId, ProtocolName
from opentela.errors import ConnectionClosedError, FabricError, ProtocolError, StreamResetError
from opentela.fabric._frames import INITIAL_WINDOW, MAX_WINDOW, ErrorCode


class StreamLink(Protocol):
    """What a stream needs from the connection that carries it; only MuxStream calls these, with its own id."""

    max_frame: int
    write_paused: bool

    def send_data(self, stream_id: int, data: bytes | memoryview, fin: bool) -> None:
        """Queue stream bytes (within the credit the stream holds), with FIN when `fin`."""
        ...

    def send_window_update(self, stream_id: int, delta: int) -> None:
        """Grant the peer `delta` more bytes of credit."""
        ...

    def send_reset(self, stream_id: int, code: int, message: str) -> None:
        """Abort the stream at the peer."""
        ...

    def release_stream(self, stream_id: int) -> None:
        """The stream is finished in both directions: forget it."""
        ...

    def flush(self) -> None: ...

    async def wait_writable(self) -> None: ...


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class MuxStream:
    """A flow-controlled byte stream; satisfies `opentela._types.Stream`.

    `read()` returns what is buffered (waiting for at least one byte), b"" once the peer half-closed.
    `write()` returns once the data is queued, waiting for credit when the peer's window is used up.
    `aclose()` half-closes our side and, if the peer is still sending, resets the stream (code CANCEL) since
    nobody will read the rest. A reset received after the peer's FIN leaves what it sent readable.
    """

    __slots__ = (
        "__weakref__",
        "_buffered",
        "_chunks",
        "_id",
        "_link",
        "_local_eof",
        "_on_abort",
        "_peer",
        "_protocol",
        "_read_exc",
        "_read_waiter",
        "_recv_window",
        "_released",
        "_remote_eof",
        "_send_window",
        "_unacked",
        "_window",
        "_write_exc",
        "_write_waiter",
    )

    def __init__(
        self, link: StreamLink, stream_id: int, protocol: ProtocolName, remote_peer: PeerId, window: int
    ) -> None:
        self._link = link
        self._id = stream_id
        self._protocol = protocol
        self._peer = remote_peer
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._remote_eof = False
        self._local_eof = False
        self._released = False
        self._read_exc: FabricError | None = None
        self._write_exc: FabricError | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._write_waiter: asyncio.Future[None] | None = None
        self._on_abort: Callable[[], object] | None = None
        self._send_window = INITIAL_WINDOW
        self._recv_window = INITIAL_WINDOW  # credit the peer still has; the link grants `window` at open
        self._window = window
        self._unacked = 0  # bytes read but not yet credited back to the peer

    @property
    def protocol(self) -> ProtocolName:
        """The protocol named in the stream's opening frame."""
        return self._protocol

    @property
    def remote_peer(self) -> PeerId:
        """The peer at the other end."""
        return self._peer

    @property
    def stream_id(self) -> int:
        """The id on its connection (odd: opened by the dialer, even: by the listener)."""
        return self._id

    @property
    def closed(self) -> bool:
        """True once both directions finished or the stream was reset."""
        return self._released

    def __repr__(self) -> str:
        if self._read_exc is not None or self._write_exc is not None:
            state = "reset"
        elif self._released:
            state = "closed"
        elif self._local_eof or self._remote_eof:
            state = "half-closed(" + ("local" if self._local_eof else "remote") + ")"
        else:
            state = "open"
        return (
            f"<MuxStream {self._id} {self._protocol} peer={self._peer[-8:]} {state} "
            f"buffered={self._buffered} send_window={self._send_window}>"
        )

    # --- reading ------------------------------------------------------------------------------------------
    async def _wait(self, reading: bool) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._link.flush()  # this task is about to sleep: send what it wrote now
        if reading:
            if self._read_waiter is not None:
                raise RuntimeError(f"{self!r} is already being read by another task")
            self._read_waiter = waiter
        else:
            if self._write_waiter is not None:
                raise RuntimeError(f"{self!r} is already being written by another task")
            self._write_waiter = waiter
        try:
            await waiter
        finally:
            if reading:
                self._read_waiter = None
            else:
                self._write_waiter = None

    def _take(self, n: int) -> bytes:
        chunks = self._chunks
        if n >= self._buffered:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:
            parts = []
            need = n
            while need:
                chunk = chunks[0]
                if len(chunk) <= need:
                    parts.append(chunks.popleft())
                    need -= len(chunk)
                else:
                    parts.append(chunk[:need])
                    chunks[0] = chunk[need:]
                    need = 0
            data = b"".join(parts)
        self._buffered -= len(data)
        self._consumed(len(data))
        return data

    def _consumed(self, n: int) -> None:
        self._unacked += n
        # Credit back in batches of half a window: one WINDOW_UPDATE per 128 KiB read, not one per read.
        if self._unacked >= self._window >> 1 and not self._remote_eof and not self._released:
            self._grant(0)

    def _grant(self, extra: int) -> None:
        delta = self._unacked + extra
        self._unacked = 0
        if delta > 0:
            self._recv_window += delta
            self._link.send_window_update(self._id, delta)

    async def read(self, max_bytes: int = -1) -> bytes:
        """Up to `max_bytes` (all that is buffered when -1); waits for data; b"" at end of stream."""
        while not self._chunks:
            if self._read_exc is not None:
                raise self._read_exc
            if self._remote_eof or max_bytes == 0:
                return b""
            await self._wait(True)
        if self._read_exc is not None:
            raise self._read_exc
        return self._take(self._buffered if max_bytes < 0 else max_bytes)

    async def readexactly(self, n: int) -> bytes:
        """Exactly `n` bytes; asyncio.IncompleteReadError if the stream ends first."""
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        while self._buffered < n:
            if self._read_exc is not None:
                raise self._read_exc
            if self._remote_eof:
                partial = self._take(self._buffered) if self._buffered else b""
                raise asyncio.IncompleteReadError(partial, n)
            # Asked for more than the peer may send unread: widen its credit by the shortfall, so a large
            # readexactly cannot deadlock against flow control (the caller asked to hold n bytes anyway).
            shortfall = n - self._buffered - self._recv_window
            if shortfall > 0 and not self._released:
                self._grant(shortfall)
            await self._wait(True)
        if self._read_exc is not None:
            raise self._read_exc
        return self._take(n) if n else b""

    def read_all_nowait(self) -> bytes | None:
        """Everything the peer sent, at once, when it has half-closed and nothing has been read yet; None when
        that is not so now (read with `read`). For a handler that serves a whole request without waiting."""
        if not self._remote_eof or self._read_exc is not None or self._read_waiter is not None:
            return None
        return self._take(self._buffered) if self._buffered else b""

    # --- writing ------------------------------------------------------------------------------------------
    async def write(self, data: bytes) -> None:
        """Queue `data`, waiting for the peer's credit; StreamResetError/ConnectionClosedError if aborted."""
        if self._write_exc is not None:
            raise self._write_exc
        if self._local_eof:
            raise RuntimeError(f"write after write_eof on {self!r}")
        if type(data) is not bytes:
            data = bytes(data)  # the link may hold on to it until the next flush; it must not change
        n = len(data)
        link = self._link
        if n <= self._send_window and n <= link.max_frame:
            if n:
                self._send_window -= n
                link.send_data(self._id, data, False)
        else:
            view = memoryview(data)
            pos = 0
            while pos < n:
                if self._write_exc is not None:
                    raise self._write_exc
                if self._send_window <= 0:
                    await self._wait(False)
                    continue
                k = min(n - pos, self._send_window, link.max_frame)
                self._send_window -= k
                link.send_data(self._id, view[pos : pos + k], False)
                pos += k
                if link.write_paused:
                    await link.wait_writable()
        if link.write_paused:
            await link.wait_writable()

    def write_last_nowait(self, data: bytes) -> bool:
        """Write `data` and half-close, in one frame, when the peer's credit and the link allow it now; False,
        with nothing written, when they do not (then `write` and `write_eof`)."""
        link = self._link
        n = len(data)
        if (
            self._write_exc is not None
            or self._local_eof
            or self._write_waiter is not None
            or n > self._send_window
            or n > link.max_frame
            or link.write_paused
        ):
            return False
        self._send_window -= n
        self._local_eof = True
        link.send_data(self._id, data, True)
        link.flush()
        if self._remote_eof:
            self._release()
        return True

    async def write_eof(self) -> None:
        """Half-close: the peer reads b"" after what we wrote; we may still read."""
        if self._local_eof or (self._released and self._write_exc is None):
            return
        if self._write_exc is not None:
            raise self._write_exc
        self._local_eof = True
        self._link.send_data(self._id, b"", True)
        self._link.flush()  # nothing more follows on this stream: do not wait for the end of the loop pass
        if self._remote_eof:
            self._release()

    def reset(self, code: int = 0, message: str = "") -> None:
        """Abort both directions now; pending and later reads and writes on both ends raise."""
        if self._released:
            return
        exc = StreamResetError(message or "stream reset", reset_code=code)
        self._on_abort = None  # our own reset: whoever watches already knows
        self._abort(exc, exc)
        self._link.send_reset(self._id, code, message)
        self._release()

    async def aclose(self) -> None:
        """Finish with the stream: half-close, and reset it if the peer has not finished sending."""
        if self._released:
            return
        if not self._local_eof and self._write_exc is None:
            self._local_eof = True
            self._link.send_data(self._id, b"", True)
        if self._remote_eof:
            self._release()
        else:
            self.reset(ErrorCode.CANCEL, "stream closed before the end of its data")

    def on_abort(self, callback: Callable[[], object] | None) -> None:
        """Call `callback` once if the stream is reset or its connection is lost (None: stop watching).

        A server that has read the whole request learns nothing from `read` any more (the peer half-closed), so
        this is how it hears that the asker gave up while it is still waiting on work of its own."""
        self._on_abort = callback

    # --- events from the link (MuxConnection and memory.py call these; applications do not) ------------------
    def _abort(self, read_exc: FabricError | None, write_exc: FabricError) -> None:
        callback, self._on_abort = self._on_abort, None
        if callback is not None and self._write_exc is None:
            callback()
        self._write_exc = write_exc
        if read_exc is not None:
            self._read_exc = read_exc
            self._chunks.clear()
            self._buffered = 0
        _wake(self._read_waiter)
        _wake(self._write_waiter)

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._link.release_stream(self._id)

    def open_window(self) -> None:
        """Raise the peer's credit from the protocol's initial window to this stream's; the link calls it once."""
        if self._window > INITIAL_WINDOW:
            self._grant(self._window - INITIAL_WINDOW)

    def feed_data(self, data: bytes, fin: bool) -> None:
        """Bytes from the peer; ProtocolError if they come after its FIN or exceed the credit we gave."""
        if self._remote_eof:
            raise ProtocolError(f"data after FIN on stream {self._id}")
        n = len(data)
        if n:
            if n > self._recv_window:
                raise ProtocolError(
                    f"stream {self._id} exceeded its flow-control window",
                    wire_code=ErrorCode.FLOW_CONTROL_ERROR,
                )
            self._recv_window -= n
            self._chunks.append(data)
            self._buffered += n
        if fin:
            self._remote_eof = True
        _wake(self._read_waiter)
        if fin and self._local_eof:
            self._release()

    def feed_window_update(self, delta: int) -> None:
        """Credit from the peer; ProtocolError if it overflows the window."""
        self._send_window += delta
        _wake(self._write_waiter)
        if self._send_window > MAX_WINDOW:
            raise ProtocolError(
                f"window of stream {self._id} overflowed", wire_code=ErrorCode.FLOW_CONTROL_ERROR
            )

    def feed_reset(self, code: int, message: str) -> None:
        """The peer aborted the stream."""
        exc = StreamResetError(f"stream reset by peer (code {code}): {message}", reset_code=code)
        # If the peer had already finished sending, everything it sent arrived: keep it readable.
        self._abort(None if self._remote_eof else exc, exc)
        self._release()

    def connection_lost(self, exc: ConnectionClosedError) -> None:
        """The connection went away; the link has already forgotten this stream."""
        self._released = True
        self._abort(None if self._remote_eof else exc, exc)
