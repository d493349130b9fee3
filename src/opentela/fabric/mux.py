"""One authenticated peer connection carrying many multiplexed streams (an asyncio.Protocol over TCP).

The connection runs TLS itself (tls.TlsSession, on memory buffers: cheaper than asyncio's SSL transport),
then the identity handshake over the decrypted bytes (`recv_exactly`/`send`), then `start()` switches it to
frames. Outgoing frames are queued and written together once per event-loop pass: a request's SYN, data and FIN
leave in one TLS record and one syscall, without any timer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from opentela._types import PeerId, ProtocolName
from opentela.errors import ConnectionClosedError, HandshakeError, ProtocolError
from opentela.fabric import _frames as fr
from opentela.fabric._config import FabricConfig
from opentela.fabric.stream import MuxStream
from opentela.fabric.tls import TlsSession

logger = logging.getLogger(__name__)

_SMALL = 16 * 1024  # payloads up to this are copied into one buffer with their header (and may take a FIN)
_JOIN_LIMIT = 64 * 1024  # output up to this is joined into one write; above, writelines avoids the copy
_MAX_REASON = 512
_MAX_EARLY_DATA = 64 * 1024  # bytes a peer may send before the identity handshake is done


def _reason(message: str) -> str:
    raw = message.encode()
    return message if len(raw) <= _MAX_REASON else raw[:_MAX_REASON].decode(errors="ignore")


class MuxConnection(asyncio.Protocol):
    """A TLS connection to one peer, multiplexing MuxStreams; see docs/protocol.md for the rules.

    Callbacks: `on_made` when the TCP connection is up, `on_secure` when TLS is, `on_stream` for each inbound
    stream, `on_goaway` when the peer says goodbye, `on_close` once when the connection ends.
    """

    def __init__(
        self,
        config: FabricConfig,
        tls_context: ssl.SSLContext,
        *,
        initiator: bool,
        on_stream: Callable[[MuxStream], None] | None = None,
        on_goaway: Callable[[MuxConnection, int, str], None] | None = None,
        on_close: Callable[[MuxConnection], None] | None = None,
        on_made: Callable[[MuxConnection], None] | None = None,
        on_secure: Callable[[MuxConnection], None] | None = None,
    ) -> None:
        self.config = config
        self.initiator = initiator
        self.remote_peer: PeerId = ""
        self.max_frame = config.max_frame_payload
        self.write_paused = False
        self.on_stream = on_stream
        self.on_goaway = on_goaway
        self.on_close = on_close
        self.on_made = on_made
        self.on_secure = on_secure
        self._loop = asyncio.get_running_loop()
        self._tls = TlsSession(tls_context, server_side=not initiator)
        self.secure: asyncio.Future[None] = self._loop.create_future()
        """Done when TLS is up or the connection failed before (check `error`)."""
        self._deadline: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._decoder = fr.FrameDecoder()
        self._streams: dict[int, MuxStream] = {}
        self._next_id = 1 if initiator else 2
        self._last_remote_id = 0
        self._inbound = 0
        # Outbound streams whose SYN has not left yet, in id order (the peer must see ids in order): the SYN
        # goes out with the stream's first frame, or alone at the next flush.
        self._syn_pending: dict[int, bytes] = {}
        self._out: list[Any] = []
        # The last DATA frame of each stream still in `_out`: write_eof sets FIN on it instead of adding a frame.
        self._tails: dict[int, bytearray] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._hs_buf = bytearray()
        self._hs_waiter: asyncio.Future[None] | None = None
        self._running = False
        self._goaway_sent = False
        self._goaway_received = False
        self.error: Exception | None = None
        """Why the connection ended (None while it is alive)."""
        self.lost: asyncio.Future[None] = self._loop.create_future()
        """Done once the transport is gone."""
        self._last_recv = self._loop.time()
        self._ping_sent_at = 0.0
        self._ping_value = 0
        self._keepalive: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        role = "dialer" if self.initiator else "listener"
        if self.error is not None:
            state = f"closed ({self.error})"
        elif self._goaway_sent or self._goaway_received:
            state = "draining"
        else:
            state = "open" if self._running else "handshaking"
        peer = self.remote_peer[-8:] if self.remote_peer else "?"
        return f"<MuxConnection {role} peer={peer} {state} streams={len(self._streams)}>"

    # --- state ----------------------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        """True while new streams may be opened on this connection."""
        return self._running and self.error is None and not (self._goaway_sent or self._goaway_received)

    @property
    def stream_count(self) -> int:
        """Streams currently open (both directions)."""
        return len(self._streams)

    @property
    def streams_opened(self) -> int:
        """Streams ever opened here, both directions; read off the stream ids, so it costs nothing per stream."""
        ours = (self._next_id - (1 if self.initiator else 2)) // 2
        return ours + (self._last_remote_id + 1) // 2

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Transport details: "ssl_object" (the TLS session), "peername", "sockname", ..."""
        if name == "ssl_object":
            return self._tls.ssl_object if self._tls.handshake_done else default
        return self._transport.get_extra_info(name, default) if self._transport is not None else default

    # --- asyncio.Protocol -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """TCP is up: start TLS, and give TLS plus the identity handshake a deadline."""
        self._transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        self._deadline = self._loop.call_later(self.config.handshake_timeout, self._handshake_expired)
        if self.on_made is not None:
            self.on_made(self)
            if self.error is not None:
                return
        try:
            hello = self._tls.start()
        except ssl.SSLError as exc:
            self._fail(HandshakeError(f"TLS failed to start: {exc}"), abort=True)
            return
        if hello:
            transport.write(hello)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        """Decrypt, then decode and dispatch frames; a malformed record or frame ends the connection."""
        if self.error is not None:
            return
        tls = self._tls
        try:
            data = tls.receive(data)
        except ssl.SSLError as exc:
            if tls.handshake_done:
                self._fail(ProtocolError(f"TLS record error: {exc}"), abort=True)
            else:
                self._fail(HandshakeError(f"TLS handshake failed: {exc}"), abort=True)
            return
        out = tls.outgoing()
        if out:
            self._transport.write(out)  # type: ignore[union-attr]  # handshake flights, post-handshake replies
        if not self.secure.done() and tls.handshake_done:
            self.secure.set_result(None)
            if self.on_secure is not None:
                self.on_secure(self)
        if data:
            self._plain_received(data)
        if tls.eof:
            self._fail(ConnectionClosedError(f"{self.remote_peer or 'peer'} closed the connection"))

    def _plain_received(self, data: bytes) -> None:
        if not self._running:
            self._hs_buf += data
            if len(self._hs_buf) > _MAX_EARLY_DATA:
                self._fail(HandshakeError("peer sent too much before the handshake finished"), abort=True)
            if self._hs_waiter is not None and not self._hs_waiter.done():
                self._hs_waiter.set_result(None)
            return
        if self.error is not None:
            return
        self._last_recv = self._loop.time()
        try:
            for frame in self._decoder.feed(data):
                self._dispatch(frame)
        except ProtocolError as exc:
            logger.warning("protocol error from %s, closing the connection: %s", self.remote_peer, exc)
            self._fail(exc, goaway=exc.details.get("wire_code", fr.ErrorCode.PROTOCOL_ERROR))

    def eof_received(self) -> bool | None:
        """The peer closed its side; we close ours (streams fail in connection_lost)."""
        return None

    def _handshake_expired(self) -> None:
        self._deadline = None
        if not self._running:
            exc = HandshakeError(f"handshake not done within {self.config.handshake_timeout}s", timeout=True)
            self._fail(exc, abort=True)

    def connection_lost(self, exc: Exception | None) -> None:
        """The transport is gone: fail every stream."""
        reason = f"connection to {self.remote_peer or 'peer'} lost" + (f": {exc}" if exc else "")
        self._fail(ConnectionClosedError(reason))
        self._transport = None
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        """The transport's buffer is full: writers wait."""
        self.write_paused = True

    def resume_writing(self) -> None:
        """The transport drained: wake writers."""
        self.write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_writable(self) -> None:
        """Wait until the transport accepts more output."""
        while self.write_paused and self.error is None:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    # --- handshake phase ------------------------------------------------------------------------------------
    async def recv_exactly(self, n: int) -> bytes:
        """Handshake only: the next `n` raw bytes."""
        while len(self._hs_buf) < n:
            if isinstance(self.error, HandshakeError):
                raise self.error
            if self.error is not None:
                raise HandshakeError(f"connection closed during the handshake: {self.error}")
            self._hs_waiter = self._loop.create_future()
            try:
                await self._hs_waiter
            finally:
                self._hs_waiter = None
        data = bytes(self._hs_buf[:n])
        del self._hs_buf[:n]
        return data

    def send(self, data: bytes) -> None:
        """Handshake only: bytes to the peer outside any frame (encrypted, sent at once)."""
        if self._transport is None or self.error is not None:
            raise HandshakeError("connection closed during the handshake")
        self._tls.encrypt(data)
        self._transport.write(self._tls.outgoing())

    def start(self, remote_peer: PeerId) -> None:
        """The handshake succeeded: switch to frames (processing anything that already arrived)."""
        self.remote_peer = remote_peer
        self._running = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._last_recv = self._loop.time()
        self._keepalive = self._loop.call_later(self.config.keepalive_interval, self._keepalive_tick)
        pending, self._hs_buf = bytes(self._hs_buf), bytearray()
        if pending:
            self._plain_received(pending)

    # --- opening streams ------------------------------------------------------------------------------------
    def open_stream(self, protocol: ProtocolName) -> MuxStream:
        """A new outbound stream; its SYN leaves with its first data (or alone at the end of this loop pass)."""
        if not self.usable:
            raise ConnectionClosedError(f"{self!r} takes no new streams")
        prefix = fr.syn_prefix(protocol)
        stream_id = self._next_id
        if stream_id > fr.MAX_STREAM_ID:
            self.go_away(fr.ErrorCode.NO_ERROR, "stream ids exhausted")
            raise ConnectionClosedError(f"{self!r} ran out of stream ids")
        self._next_id += 2
        self._syn_pending[stream_id] = prefix
        stream = MuxStream(self, stream_id, protocol, self.remote_peer, self.config.stream_window)
        self._streams[stream_id] = stream
        stream.open_window()
        self._schedule_flush()
        return stream

    # --- output ---------------------------------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write out queued frames now rather than at the end of this loop pass.

        Streams call it when their task is about to wait (a read with nothing buffered) or has finished
        writing (write_eof): nothing more is coming from them this pass, so waiting would only add latency.
        """
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush()

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._take_output()
        if out:
            self._write(out)

    def _take_output(self) -> list[Any]:
        """The frames queued so far, with the SYNs still pending; the queue starts over empty."""
        if self._syn_pending:
            for stream_id, prefix in self._syn_pending.items():
                self._syn_frame(stream_id, prefix, b"", 0)
            self._syn_pending.clear()
        out = self._out
        if out:
            self._out = []
            self._tails.clear()
        return out

    def _write(self, out: list[Any]) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        tls = self._tls
        if len(out) == 1:
            tls.encrypt(out[0])
        elif sum(map(len, out)) <= _JOIN_LIMIT:
            tls.encrypt(b"".join(out))  # one TLS record for many small frames
        else:
            for chunk in out:
                tls.encrypt(chunk)
        transport.write(tls.outgoing())

    def _emit_syn(self, stream_id: int, data: bytes | memoryview = b"", flags: int = 0) -> None:
        """Emit the SYN of a pending stream, after those of streams opened before it (ids arrive in order)."""
        pending = self._syn_pending
        while pending:
            earlier = next(iter(pending))
            prefix = pending.pop(earlier)
            if earlier == stream_id:
                self._syn_frame(stream_id, prefix, data, flags)
                return
            self._syn_frame(earlier, prefix, b"", 0)

    def _syn_frame(self, stream_id: int, prefix: bytes, data: bytes | memoryview, flags: int) -> None:
        frame = fr.data_frame(stream_id, data, flags | fr.SYN, prefix)
        self._out.append(frame)
        self._tails[stream_id] = frame

    # --- the StreamLink side: called by MuxStream only -------------------------------------------------------
    def send_data(self, stream_id: int, data: bytes | memoryview, fin: bool) -> None:
        """Queue a DATA frame for a stream (MuxStream only: it has checked the credit)."""
        if self.error is not None:
            return
        flags = fr.FIN if fin else 0
        if self._syn_pending and stream_id in self._syn_pending:
            self._emit_syn(stream_id, data, flags)
        elif not data and fin and (tail := self._tails.pop(stream_id, None)) is not None:
            fr.set_fin(tail)
            return
        elif len(data) <= _SMALL:
            frame = fr.data_frame(stream_id, data, flags)
            self._out.append(frame)
            self._tails[stream_id] = frame
        else:
            self._out.append(fr.encode_header(fr.DATA, flags, stream_id, len(data)))
            self._out.append(data)  # large: written after its header as is, not copied into one buffer
            self._tails.pop(stream_id, None)
        self._schedule_flush()

    def send_window_update(self, stream_id: int, delta: int) -> None:
        """Queue a WINDOW_UPDATE granting the peer more credit on a stream (MuxStream only)."""
        if self.error is not None:
            return
        if self._syn_pending and stream_id in self._syn_pending:
            self._emit_syn(stream_id)
        self._out.append(fr.encode_window_update(stream_id, delta))
        self._schedule_flush()

    def send_reset(self, stream_id: int, code: int, message: str) -> None:
        """Queue a RST aborting a stream (MuxStream only)."""
        if self.error is not None:
            return
        if self._syn_pending.pop(stream_id, None) is not None:
            return  # the peer never heard of it: nothing to reset
        self._out.append(fr.encode_rst(stream_id, code, _reason(message)))
        self._schedule_flush()

    def release_stream(self, stream_id: int) -> None:
        """Forget a stream finished in both directions (MuxStream only)."""
        if self._streams.pop(stream_id, None) is not None and (stream_id & 1) != self.initiator:
            self._inbound -= 1
        if not self._streams and self._goaway_sent and self._goaway_received:
            self.close()

    # --- input ----------------------------------------------------------------------------------------------
    def _dispatch(self, frame: fr.Frame) -> None:
        ftype = frame.type
        if ftype == fr.DATA:
            flags = frame.flags
            if flags & fr.SYN:
                self._on_syn(frame)
                return
            stream = self._streams.get(frame.stream_id)
            if stream is None:
                self._check_stale(frame.stream_id)
            elif flags & fr.RST:
                stream.feed_reset(frame.code, frame.message)
            else:
                stream.feed_data(frame.data, bool(flags & fr.FIN))  # ProtocolError after FIN or over credit
        elif ftype == fr.WINDOW_UPDATE:
            stream = self._streams.get(frame.stream_id)
            if stream is None:
                self._check_stale(frame.stream_id)
            else:
                stream.feed_window_update(frame.value)
        elif ftype == fr.PING:
            # A peer that pings but does not read our output gets no answers queued up without bound.
            if not frame.flags & fr.ACK and not self.write_paused:
                self._out.append(fr.encode_ping(frame.value, ack=True))
                self._schedule_flush()
        else:
            self._on_goaway(frame.code, frame.message)

    def _check_stale(self, stream_id: int) -> None:
        """A frame for a stream we do not hold: fine if it was closed, a protocol error if never opened."""
        if (stream_id & 1) == self.initiator:
            if stream_id >= self._next_id:
                raise ProtocolError(f"frame for our stream {stream_id}, which was never opened")
        elif stream_id > self._last_remote_id:
            raise ProtocolError(f"frame for stream {stream_id}, which the peer never opened")

    def _on_syn(self, frame: fr.Frame) -> None:
        stream_id = frame.stream_id
        if (stream_id & 1) == self.initiator:
            raise ProtocolError(f"the peer opened stream {stream_id}, an id from our half")
        if stream_id <= self._last_remote_id:
            raise ProtocolError(f"stream id {stream_id} reused or out of order")
        self._last_remote_id = stream_id
        if self.error is not None:
            return
        if self._inbound >= self.config.max_inbound_streams:
            logger.info("refusing stream %d from %s: too many streams", stream_id, self.remote_peer)
            self._out.append(fr.encode_rst(stream_id, fr.ErrorCode.REFUSED_STREAM, "too many streams"))
            self._schedule_flush()
            return
        stream = MuxStream(self, stream_id, frame.protocol, self.remote_peer, self.config.stream_window)
        stream.feed_data(frame.data, bool(frame.flags & fr.FIN))  # ProtocolError if over the initial window
        self._streams[stream_id] = stream
        self._inbound += 1
        stream.open_window()
        if self.on_stream is None:
            stream.reset(fr.ErrorCode.UNKNOWN_PROTOCOL, "this peer accepts no streams")
            return
        try:
            self.on_stream(stream)
        except Exception:
            logger.exception("stream dispatch failed for %r", stream)
            stream.reset(fr.ErrorCode.INTERNAL_ERROR, "stream dispatch failed")

    def _on_goaway(self, code: int, message: str) -> None:
        first = not self._goaway_received
        self._goaway_received = True
        logger.debug("GOAWAY from %s: code %d %s", self.remote_peer, code, message)
        # Answer with ours, so both sides know neither opens more streams and the last one out closes.
        self.go_away(code if code == fr.ErrorCode.DUPLICATE_CONNECTION else fr.ErrorCode.NO_ERROR, "goodbye")
        if first and self.on_goaway is not None:
            self.on_goaway(self, code, message)
        if not self._streams:
            self.close()

    # --- keepalive ------------------------------------------------------------------------------------------
    def _keepalive_tick(self) -> None:
        now = self._loop.time()
        interval = self.config.keepalive_interval
        if now - self._last_recv < interval:
            # Traffic proves the peer alive; look again when the connection has been quiet for a full interval.
            self._keepalive = self._loop.call_at(self._last_recv + interval, self._keepalive_tick)
            return
        self._ping_value = (self._ping_value + 1) & 0xFFFFFFFFFFFFFFFF
        self._ping_sent_at = now
        self._out.append(fr.encode_ping(self._ping_value))
        self._schedule_flush()
        self._keepalive = self._loop.call_later(self.config.keepalive_timeout, self._keepalive_expired)

    def _keepalive_expired(self) -> None:
        if self._last_recv >= self._ping_sent_at:
            self._keepalive_tick()
            return
        logger.warning("peer %s did not answer a keepalive ping: closing the connection", self.remote_peer)
        self._fail(
            ConnectionClosedError(
                f"keepalive timeout: {self.remote_peer} silent for {self.config.keepalive_timeout}s"
            ),
            abort=True,
        )

    # --- closing --------------------------------------------------------------------------------------------
    def go_away(self, code: int = fr.ErrorCode.NO_ERROR, message: str = "") -> None:
        """Announce that we open no more streams here; the connection closes once both sides are done."""
        if self._goaway_sent or self.error is not None or self._transport is None:
            return
        self._goaway_sent = True
        self._out.append(fr.encode_goaway(code, _reason(message)))
        self._schedule_flush()
        if self._goaway_received and not self._streams:
            self.close()

    def close(self, code: int = fr.ErrorCode.NO_ERROR, message: str = "connection closed") -> None:
        """Orderly close: GOAWAY, flush, close the transport; open streams fail with ConnectionClosedError."""
        if self.error is not None:
            return
        if self._running:
            self.go_away(code, message)
        self._fail(ConnectionClosedError(f"connection to {self.remote_peer or 'peer'} closed: {message}"))

    def abort(self) -> None:
        """Drop the connection at once, without a goodbye (also cuts short a close already under way)."""
        if self.error is None:
            self._fail(
                ConnectionClosedError(f"connection to {self.remote_peer or 'peer'} aborted"), abort=True
            )
        elif self._transport is not None:
            self._transport.abort()

    def _fail(self, exc: Exception, *, goaway: int | None = None, abort: bool = False) -> None:
        if self.error is not None:
            return
        self.error = exc
        for timer in (self._keepalive, self._deadline):
            if timer is not None:
                timer.cancel()
        self._keepalive = self._deadline = None
        if goaway is not None and self._running and not self._goaway_sent and not abort:
            self._goaway_sent = True
            self._out.append(fr.encode_goaway(goaway, _reason(str(exc))))
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            if not abort and isinstance(exc, (ConnectionClosedError, ProtocolError)):
                self._syn_pending.clear()
                self._flush()  # last words (GOAWAY, pending frames) before the close
                goodbye = self._tls.close_notify()
                if goodbye:
                    transport.write(goodbye)
                transport.close()
            else:
                transport.abort()
        elif self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush_handle = None
        self._out = []
        self._tails.clear()
        closed = (
            exc
            if isinstance(exc, ConnectionClosedError)
            else ConnectionClosedError(f"connection closed: {exc}")
        )
        streams = list(self._streams.values())
        self._streams.clear()
        self._syn_pending.clear()
        for stream in streams:
            stream.connection_lost(closed)
        if not self.secure.done():
            self.secure.set_result(None)
        for waiter in [self._hs_waiter, *self._drain_waiters]:
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._drain_waiters = []
        if self.on_close is not None:
            self.on_close(self)
