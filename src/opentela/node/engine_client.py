"""A lean HTTP/1.1 client for the node -> engine hop: keep-alive connections over a Unix socket or loopback TCP.

The engine hop is paid on every request, so it gets a client that does only what that hop needs: one request per
connection at a time, pooled connections, httptools for parsing, the head and a small body written in one call,
body chunks handed over as they arrive (no line splitting, no decoding), flow control when the reader is slow.
A general client (aiohttp) spends several times as long per request on objects this hop never uses: cookie jars,
redirects, tracing hooks, multidicts, per-request timeout contexts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httptools

ENGINE_KEEPALIVE_S = 4.0
"""How long an idle connection to the engine is kept for the next request: under the 5 s keep-alive of
llama.cpp's server and of uvicorn (vLLM, SGLang), so the engine never closes one just as a request goes in."""

_HIGH_WATER = 256 * 1024
"""Buffered body bytes at which reading from the engine pauses until the consumer catches up."""
_MAX_HEAD_BYTES = 64 * 1024


class EngineConnectionError(ConnectionError):
    """The engine could not be reached, or the connection broke before the response was complete."""


class EngineProtocolError(EngineConnectionError):
    """The engine answered something that is not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """Where an engine is reached: its TCP base URL, and a Unix socket it also listens on (preferred)."""

    base_url: str
    """``http://host:port``; also the key of per-engine bookkeeping."""
    unix_socket: str | None = None

    @property
    def host_port(self) -> tuple[str, int]:
        """Host and port of `base_url`."""
        rest = self.base_url.split("://", 1)[-1].rstrip("/")
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port)


class _Connection(asyncio.Protocol):
    """One connection to an engine; carries one request-response exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.listener: Callable[[], None] | None = None
        """Called after each batch of bytes and when the connection is lost (EngineCall.listen)."""
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._header_name = b""
        self._head_bytes = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received_any = False
        self.error: BaseException | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineProtocolError(f"malformed response from the engine: {exc}"))
            self.close()
            return
        if self.buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self.listener is not None:
            self.listener()  # once the parser is done with these bytes, never from inside its callbacks

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and not self.complete and not self._has_length():
            # No length and not chunked: the body runs until the engine closes the connection.
            self.complete = True
            self.keep_alive = False
            self._wake()
            return
        if not self.complete:
            self._fail(EngineConnectionError(f"engine closed the connection{f': {exc}' if exc else ''}"))
        if self.listener is not None:
            self.listener()

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD_BYTES:
            raise httptools.HttpParserError("response head too large")
        if name:
            self._header_name = name
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        else:  # a continuation of the previous header's value
            key = self._header_name.decode("latin-1").lower()
            self.headers[key] = self.headers.get(key, "") + value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:
            # An interim answer (100 Continue): its headers are not the response's.
            self.headers = {}
            self._head_bytes = 0
            return
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        if not self.head_done:
            return  # the end of an interim answer
        self.keep_alive = self._parser.should_keep_alive()
        self.complete = True
        self._wake()

    # --- used by EngineResponse ---

    def _has_length(self) -> bool:
        return (
            "content-length" in self.headers or "chunked" in self.headers.get("transfer-encoding", "").lower()
        )

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Wait until something arrives (head, body, end or failure), at most `timeout` seconds."""
        waiter = self._waiter = self._loop.create_future()
        handle = self._loop.call_later(timeout, _expire, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def take(self) -> bytes:
        """All buffered body bytes (resumes reading if it was paused)."""
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def send(self, head: bytes, body: bytes) -> None:
        """Write a request (resets the per-response state)."""
        self._reset()
        assert self.transport is not None
        # One write for a small request (one syscall, one segment); a large body goes after the head without
        # being copied into it.
        if len(body) <= 16 * 1024:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    def close(self) -> None:
        """Drop the connection (an unfinished response is abandoned: the engine sees the client leave)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("engine stopped producing output"))


class EngineResponse:
    """A response being received; read it whole (`read`) or as it comes (`chunks`), then leave the context."""

    __slots__ = ("_client", "_conn", "_done", "_key", "_read_timeout", "headers", "status")

    def __init__(self, conn: _Connection, client: EngineClient, key: str, read_timeout: float | None) -> None:
        self._conn, self._client, self._key, self._read_timeout = conn, client, key, read_timeout
        self.status = conn.status
        self.headers = conn.headers
        self._done = False

    @property
    def content_length(self) -> int | None:
        """The declared body length, if any."""
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self) -> bytes:
        """The whole body."""
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as the engine sends them."""
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                self._done = True
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_timeout)

    def release(self) -> None:
        """Give the connection back to the pool when the exchange finished cleanly; otherwise drop it."""
        conn = self._conn
        if self._done and conn.complete and conn.keep_alive and not conn.closed and conn.error is None:
            self._client._put(self._key, conn)
        else:
            conn.close()


class EngineCall:
    """A request sent without waiting on an idle pooled connection (`EngineClient.send_now`).

    Its owner learns of progress through `listen` (called from the connection's callbacks, after each batch of
    bytes and when the connection is lost), then takes a complete answer (`body`, `finish`), continues in a task
    (`response`), or drops it (`abandon`)."""

    __slots__ = ("_client", "_conn", "_key")

    def __init__(self, conn: _Connection, client: EngineClient, key: str) -> None:
        self._conn, self._client, self._key = conn, client, key

    @property
    def status(self) -> int:
        """The answer's status, once `head_done`."""
        return self._conn.status

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers (lower-case names), once `head_done`."""
        return self._conn.headers

    @property
    def head_done(self) -> bool:
        """Whether the answer's head is in."""
        return self._conn.head_done

    @property
    def complete(self) -> bool:
        """Whether the whole answer is in."""
        return self._conn.complete and self._conn.error is None

    @property
    def error(self) -> BaseException | None:
        """Why the exchange failed, if it did."""
        return self._conn.error

    @property
    def received_any(self) -> bool:
        """Whether the engine sent anything back (if not, it may never have seen the request)."""
        return self._conn.received_any

    def listen(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` as the answer comes in and if the connection is lost (None: stop)."""
        self._conn.listener = callback

    def body(self) -> bytes:
        """The body bytes in so far."""
        return self._conn.take() if self._conn.chunks else b""

    def finish(self) -> None:
        """Give the connection back to the pool (a complete, clean exchange), else close it."""
        conn = self._conn
        conn.listener = None
        if conn.complete and conn.keep_alive and not conn.closed and conn.error is None:
            self._client._put(self._key, conn)
        else:
            conn.close()

    def abandon(self) -> None:
        """Close the connection: the engine sees the client leave and stops working for it."""
        self._conn.listener = None
        self._conn.close()

    def response(self) -> EngineResponse:
        """The answer, to read on in a task like `EngineClient.request`'s; `EngineResponse.release` or
        `abandon` ends it."""
        self._conn.listener = None
        return EngineResponse(self._conn, self._client, self._key, self._client.read_timeout)


class EngineClient:
    """Pooled HTTP/1.1 connections to local engines, per target, Unix socket first."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float | None = 600.0,
        keepalive_s: float = ENGINE_KEEPALIVE_S,
        max_idle_per_target: int = 64,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle_per_target
        self._idle: dict[str, list[_Connection]] = {}
        self._no_socket: set[str] = set()
        """Unix sockets that refused us: this target is reached over TCP from now on."""
        self.opened = 0
        """Connections opened so far (a pool that works opens few)."""

    def __repr__(self) -> str:
        idle = sum(len(v) for v in self._idle.values())
        return f"<EngineClient opened={self.opened} idle={idle}>"

    async def aclose(self) -> None:
        """Close every idle connection."""
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    @contextlib.asynccontextmanager
    async def request(
        self,
        target: EngineTarget,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[EngineResponse]:
        """Send one request and yield the response once its head is in; leaving the block frees the connection.

        A pooled connection the engine closed while idle fails before any answer byte: the request then goes
        once more on a new connection (the engine never saw it).
        """
        key = target.base_url
        head = _request_head(method, path, target, headers or {}, len(body))
        for attempt in (0, 1):
            conn = self._get(key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(target)
            try:
                conn.send(head, body)
                while not conn.head_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(self.read_timeout)
            except EngineConnectionError:
                conn.close()
                if reused and attempt == 0 and not conn.received_any:
                    continue
                raise
            except BaseException:
                conn.close()  # cancelled or timed out: the engine must see us leave
                raise
            response = EngineResponse(conn, self, key, self.read_timeout)
            try:
                yield response
            except BaseException:
                conn.close()
                raise
            else:
                response.release()
            return

    def send_now(
        self,
        target: EngineTarget,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> EngineCall | None:
        """Send one request on an idle pooled connection without waiting for anything; None when there is no idle
        connection to `target` (then `request`, which opens one)."""
        key = target.base_url
        conn = self._get(key)
        if conn is None:
            return None
        conn.send(_request_head(method, path, target, headers or {}, len(body)), body)
        return EngineCall(conn, self, key)

    def _get(self, key: str) -> _Connection | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    def _put(self, key: str, conn: _Connection) -> None:
        conns = self._idle.setdefault(key, [])
        if len(conns) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conns.append(conn)

    async def _connect(self, target: EngineTarget) -> _Connection:
        loop = asyncio.get_running_loop()
        factory = lambda: _Connection(loop)  # noqa: E731
        try:
            async with asyncio.timeout(self.connect_timeout):
                if target.unix_socket and target.unix_socket not in self._no_socket:
                    try:
                        _, conn = await loop.create_unix_connection(factory, target.unix_socket)
                        self.opened += 1
                        return conn
                    except OSError:
                        # The engine does not listen there (an older build, a socket removed): TCP from now on.
                        self._no_socket.add(target.unix_socket)
                host, port = target.host_port
                _, tcp = await loop.create_connection(factory, host, port)
                self.opened += 1
                return tcp
        except TimeoutError:
            raise EngineConnectionError(
                f"engine at {target.base_url} did not accept a connection in time"
            ) from None
        except OSError as exc:
            raise EngineConnectionError(f"cannot connect to the engine at {target.base_url}: {exc}") from None


def _request_head(
    method: str, path: str, target: EngineTarget, headers: dict[str, str], length: int
) -> bytes:
    host = target.base_url.split("://", 1)[-1].rstrip("/")
    lines = [f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            continue  # never let a header value split the request
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
            lines.append(f"{name}: {value}\r\n")
    if length or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1", errors="replace")
