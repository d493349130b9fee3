"""The ingress's own HTTP/1.1 server: inference requests are served here, anything else goes to aiohttp.

Measured on the overhead benchmark (docs/benchmarks/overhead.md), aiohttp's request and response machinery
cost about 0.2 ms of the mesh's added latency per request, most of it touching its many objects in a process
that woke from idle. The inference routes are the hot path, so they get a lean server: httptools parses, a
CIMultiDict holds the headers, and the answer is written to the transport as bytes. Every other request (GETs,
CORS preflights, the split-model path, upgrade offers, compressed bodies) is handed to aiohttp's own connection
handler at a request boundary, which serves the rest of that connection: the request is written out again as
bytes (body de-chunked, with its length) and fed to it, so aiohttp sees what the client sent.

Connection rules follow aiohttp's as the gateway configures them: an idle connection closes after the
keep-alive timeout, a request head must be complete within the header timeout of its first byte, bodies over
the size limit get 413, and a client that hangs up cancels its request (the forwarder then resets the mesh
stream and the serving node stops its engine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from opentela import openai_edge as edge
from opentela.cors import API_PREFIX, CorsPolicy
from opentela.errors import InvalidRequestError, OpenTelaError, RequestTooLargeError
from opentela.gateway.access_log import log_access
from opentela.gateway.call import Call
from opentela.gateway.responses import RESPONSES_PATH
from opentela.gateway.routes.inference import SplitModel, serve_inference
from opentela.gateway.state import GatewayState

logger = logging.getLogger(__name__)

FAST_PATHS = frozenset((*edge.INFERENCE_PATHS, RESPONSES_PATH))
"""POSTs to these are served here."""

MAX_LINE = 8190
"""Longest request target and longest header field, as aiohttp allows."""
MAX_HEADERS = 128
"""Most header fields in one request, as aiohttp allows."""


@dataclass(slots=True)
class _Message:
    """One parsed request."""

    method: str = ""
    url: bytearray = field(default_factory=bytearray)
    path: str = ""
    version: str = "1.1"
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    began: float = 0.0
    """When its first byte came (loop time)."""
    keep_alive: bool = True
    fast: bool = False
    expect: bool = False
    """The client waits for "100 Continue" before sending its body (cleared once sent)."""
    error: OpenTelaError | None = None
    """Answer this instead of serving the request (and close the connection)."""

    def encode(self, complete: bool = True) -> bytes:
        """The request as bytes again for aiohttp's parser: a complete one with its body de-chunked and its
        length, else just its head as it came (its body follows as the client sends it)."""
        lines = [f"{self.method} {self.url.decode('latin-1')} HTTP/{self.version}"]
        framing = ("content-length", "transfer-encoding", "expect") if complete else ()
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in framing]
        body = b"".join(self.body) if complete else b""
        if complete and (body or self.method in ("POST", "PUT", "PATCH")):
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class FastEdgeServer:
    """Makes one `EdgeConnection` per accepted connection; hands connections over to `aiohttp_server`."""

    def __init__(
        self,
        state: GatewayState,
        aiohttp_server: web.Server,
        *,
        keepalive_timeout: float,
        header_timeout: float,
        max_body_bytes: int,
        cors: CorsPolicy | None = None,
    ) -> None:
        self.state = state
        self.aiohttp_server = aiohttp_server
        self.keepalive_timeout = keepalive_timeout
        self.header_timeout = header_timeout
        self.max_body_bytes = max_body_bytes
        self.cors = cors
        """The origins whose pages may call the API (None: CORS off, and no request's Origin is looked at)."""
        self.check_every = max(0.05, min(keepalive_timeout, header_timeout) / 4)
        """Seconds between deadline checks: a deadline is enforced up to a quarter of it late."""
        self.connections: set[EdgeConnection] = set()
        self.served = 0
        """Inference requests served here."""
        self.handovers = 0
        """Connections handed to aiohttp."""
        self._date = ("", 0)

    def __call__(self) -> EdgeConnection:
        return EdgeConnection(self)

    def date(self) -> str:
        """The Date header's value, formatted once a second."""
        now = int(time.time())
        if self._date[1] != now:
            self._date = (formatdate(now, usegmt=True), now)
        return self._date[0]

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections now; give requests in progress up to `timeout` seconds, then cancel them."""
        busy = [c for c in self.connections if c.busy()]
        for conn in list(self.connections):
            if not conn.busy():
                conn.close()
        tasks = [c.task for c in busy if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for conn in list(self.connections):
            conn.close()


class EdgeConnection(asyncio.Protocol):
    """One client connection of the ingress."""

    def __init__(self, server: FastEdgeServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.remote = "-"
        self.message: _Message | None = None
        """The request being parsed."""
        self.queue: deque[_Message] = deque()
        """Parsed requests waiting their turn (pipelining)."""
        self.task: asyncio.Task[None] | None = None
        self.handed_over = False
        self._handler: Any = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        """When the connection last had nothing to do (loop time)."""
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._rejected = False
        """A request was refused (malformed, too large): nothing more is read from this connection."""
        self._tail: bytearray | None = None
        """After an upgrade request, the bytes aiohttp is to parse."""

    # --- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else str(peer or "-")
        self.server.connections.add(self)
        self._idle_since = self._loop.time()
        self._timer = self._loop.call_later(self.server.check_every, self._check_deadlines)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self._stop_timer()
        self.transport = None
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client hung up: its request stops (the forwarder resets the mesh stream)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._tail is not None:
            self._tail += data  # bytes after an upgrade request: aiohttp parses them
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # An upgrade request (e.g. curl's h2c offer): aiohttp answers it as it would (HTTP/1.1).
            # The parser stops after the upgrade request's head (it may have called it complete, without its
            # body): pass that head on as it came, and everything after it untouched.
            rest = data[upgrade.args[0] :] if upgrade.args else b""
            head = self.message or (self.queue.pop() if self.queue else None)
            self.message = None
            self._tail = bytearray((head.encode(complete=False) if head is not None else b"") + rest)
            self.handed_over = True
        except httptools.HttpParserError as exc:
            self._malformed(InvalidRequestError(f"bad HTTP request: {exc}"))
        if self.handed_over and self.message is None and not self.busy():
            self._switch()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # --- httptools callbacks -----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._rejected:
            return
        self.message = _Message(began=self._loop.time())

    def on_url(self, url: bytes) -> None:
        if self._rejected:
            return
        assert self.message is not None
        self.message.url += url
        if len(self.message.url) > MAX_LINE:
            raise httptools.HttpParserError(f"request target longer than {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._rejected:
            return
        assert self.message is not None
        if len(name) + len(value) > MAX_LINE or len(self.message.headers) >= MAX_HEADERS:
            raise httptools.HttpParserError("header field too long or too many header fields")
        self.message.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        msg = self.message
        assert msg is not None
        msg.method = self.parser.get_method().decode("latin-1")
        msg.version = self.parser.get_http_version()
        msg.keep_alive = self.parser.should_keep_alive()
        msg.path = httptools.parse_url(bytes(msg.url)).path.decode("latin-1")
        length, plain = "", True
        for name, value in msg.headers:
            key = name.lower()
            if key == "content-length":
                length = value
            elif key == "expect":
                msg.expect = value.lower() == "100-continue"
            elif key in ("upgrade", "content-encoding"):
                plain = False  # an upgrade offer, or a compressed body (aiohttp's parser inflates it)
        msg.fast = not self.handed_over and plain and msg.method == "POST" and msg.path in FAST_PATHS
        if length.isdigit() and int(length) > self.server.max_body_bytes and not self.handed_over:
            self._reject(
                msg, _too_large(self.server.max_body_bytes, int(length))
            )  # aiohttp has its own limit
            return
        if msg.expect and not self.busy():
            # The client waits for a go-ahead before its body (curl does above 1 KiB); it is sent here, so the
            # request is complete before it is served or handed over (without its Expect header).
            self._continue(msg)

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        msg = self.message
        assert msg is not None
        msg.size += len(body)
        if msg.size > self.server.max_body_bytes:
            if (
                self.handed_over
            ):  # buffered for aiohttp, which would refuse it: nothing is kept past the limit
                self._rejected = True
                self.close()
            else:
                self._reject(msg, _too_large(self.server.max_body_bytes, msg.size))
            return
        msg.body.append(body)

    def on_message_complete(self) -> None:
        if self._rejected:
            return
        msg, self.message = self.message, None
        assert msg is not None
        self.queue.append(msg)
        if not self.busy():
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # --- serving -----------------------------------------------------------------------------------------------
    def busy(self) -> bool:
        """Whether a request of this connection is being served."""
        return self.task is not None and not self.task.done()

    async def _serve(self) -> None:
        while self.queue and self.transport is not None and not self.transport.is_closing():
            msg = self.queue[0]
            if msg.error is not None:
                self.queue.popleft()
                await self._send_error(msg, msg.error, close=True)
                return
            if not msg.fast or self.handed_over:
                self.handed_over = True
                break
            self.queue.popleft()
            if not await self._serve_fast(msg):
                self.queue.appendleft(msg)
                self.handed_over = True
                break
            if not msg.keep_alive:
                self.close()
                return
        if self.handed_over:
            # The rest of the connection is aiohttp's, from the first request not served here; it is switched once
            # the parser is between requests (now, or when the request being parsed is complete).
            if self.message is None:
                self._switch()
            return
        self._idle_since = self._loop.time()
        if self.transport is not None and not self.queue and self.message is not None:
            if self.message.expect:
                self._continue(self.message)  # its head came while the request before it was served

    async def _serve_fast(self, msg: _Message) -> bool:
        """Serve one inference request; False if it must go to aiohttp (a split model)."""
        arrived = time.perf_counter()
        headers = CIMultiDictProxy(CIMultiDict(msg.headers))
        request_id = edge.request_id(headers.get(edge.REQUEST_ID_HEADER))
        path = msg.path
        cors = self.server.cors
        out = _TransportAnswer(
            self, msg, request_id, cors.answer_lines(headers.get("Origin")) if cors is not None else None
        )
        call: Call | None = None

        def keep(c: Call) -> None:
            nonlocal call
            call = c

        try:
            await serve_inference(
                self.server.state, request_id, path, b"".join(msg.body), headers, arrived, out, keep
            )
        except SplitModel:
            return False  # raised before anything was written
        except OpenTelaError as err:
            if out.status:
                self.close()  # the answer had started: it ends where it broke, and the client sees it cut
            else:
                await out.error(err)
        except Exception:
            logger.exception("unhandled error on POST %s (request %s)", path, request_id)
            if out.status:
                self.close()
            else:
                await out.error(OpenTelaError("internal error"))
        node = call.attempt.target.peer_id if call is not None and call.attempt is not None else "-"
        self.server.served += 1
        took = time.perf_counter() - arrived
        log_access(msg.method, path, out.status, out.sent, took, request_id, node, call, self.remote)
        return True

    async def _send_error(self, msg: _Message, err: OpenTelaError, *, close: bool) -> None:
        request_id = edge.request_id(None)
        cors, lines = self.server.cors, None
        if cors is not None and msg.path.startswith(API_PREFIX):
            lines = cors.answer_lines(next((v for k, v in msg.headers if k.lower() == "origin"), None))
        out = _TransportAnswer(self, msg, request_id, lines)
        msg.keep_alive = msg.keep_alive and not close
        await out.error(err)
        log_access(
            msg.method or "-", msg.path or "-", out.status, out.sent, 0.0, request_id, "-", None, self.remote
        )
        if close:
            self.close()

    def _malformed(self, err: OpenTelaError) -> None:
        """A request that cannot be parsed."""
        if self.handed_over:
            self.close()  # aiohttp serves this connection's earlier requests; it cannot answer this one
            return
        self._reject(self.message or _Message(method="POST"), err)

    def _reject(self, msg: _Message, err: OpenTelaError) -> None:
        """Answer `err` for `msg` once the requests before it are served, then close; read nothing more."""
        self._rejected = True
        self.message = None
        msg.error = err
        msg.keep_alive = False
        self.queue.append(msg)
        if not self.busy():
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # --- handing over to aiohttp -------------------------------------------------------------------------------
    def _switch(self) -> None:
        """Give the connection to aiohttp's handler, with the requests parsed but not served, as bytes."""
        transport = self.transport
        if transport is None or self._handler is not None:
            return
        self._stop_timer()
        self.server.connections.discard(self)
        self.server.handovers += 1
        pending = b"".join(m.encode() for m in self.queue) + bytes(self._tail or b"")
        self.queue.clear()
        handler = self._handler = self.server.aiohttp_server()
        handler.connection_made(transport)
        transport.set_protocol(handler)
        if self._write_paused:
            handler.pause_writing()
        if pending:
            handler.data_received(pending)

    def _continue(self, msg: _Message) -> None:
        msg.expect = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # --- writing -----------------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Write to the client; ConnectionResetError once it is gone."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)

    async def drain(self) -> None:
        """Wait while the client's socket buffer is full."""
        if self._write_paused and self.transport is not None:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self.transport is None:
            raise ConnectionResetError("the client closed the connection")

    def close(self) -> None:
        """Close the connection (after what was written)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # --- timers ------------------------------------------------------------------------------------------------
    # One timer per connection, checking its deadlines a few times per timeout, rather than a timer set and
    # cancelled for every request (each costs uvloop a timer handle of its own).
    def _check_deadlines(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        if not self.busy() and not self.queue:
            now, msg, server = self._loop.time(), self.message, self.server
            if msg is None and now - self._idle_since >= server.keepalive_timeout:
                self.close()  # idle past the keep-alive timeout
                return
            if msg is not None and not msg.method and now - msg.began >= server.header_timeout:
                self.close()  # a request head not complete within the header timeout of its first byte
                return
        self._timer = self._loop.call_later(self.server.check_every, self._check_deadlines)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _TransportAnswer:
    """AnswerWriter onto an EdgeConnection: HTTP/1.1 bytes, chunked for event streams."""

    def __init__(self, conn: EdgeConnection, msg: _Message, request_id: str, cors: str | None = None) -> None:
        self.conn, self.msg, self.request_id = conn, msg, request_id
        self.cors = cors
        """CORS header lines every answer carries (CorsPolicy.answer_lines), or None."""
        self.status = 0
        self.sent = 0
        self.chunked = msg.version == "1.1"

    def _head(self, status: int, headers: dict[str, str], framing: str | None) -> bytes:
        self.status = status
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", f"Date: {self.conn.server.date()}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self.cors is not None:
            lines.append(self.cors)
        if not self.msg.keep_alive:
            lines.append("Connection: close")
        elif self.msg.version == "1.0":
            lines.append("Connection: keep-alive")
        if framing is not None:
            lines.append(framing)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def whole(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.conn.write(self._head(status, headers, f"Content-Length: {len(body)}") + body)
        self.sent = len(body)

    async def start(self, status: int, headers: dict[str, str]) -> None:
        if not self.chunked:
            self.msg.keep_alive = False  # HTTP/1.0: the stream ends when the connection does
            self.conn.write(self._head(status, headers, None))
        else:
            self.conn.write(self._head(status, headers, "Transfer-Encoding: chunked"))

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self.chunked else chunk)
        self.sent += len(chunk)
        await self.conn.drain()

    async def end(self) -> None:
        if self.chunked:
            self.conn.write(b"0\r\n\r\n")
        if not self.msg.keep_alive:
            self.conn.close()

    async def error(self, err: OpenTelaError) -> None:
        """Send `err` as the OpenAI error JSON."""
        status, headers, body = edge.render_error(err, self.request_id)
        headers = {**headers, "Content-Type": edge.JSON_CONTENT_TYPE}
        try:
            await self.whole(status, headers, body)
        except ConnectionResetError:
            pass


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def _too_large(limit: int, size: int) -> OpenTelaError:
    return RequestTooLargeError(
        f"request body too large: Maximum request body size {limit} exceeded, actual body size {size}"
    )
