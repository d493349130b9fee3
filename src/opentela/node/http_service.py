"""Serving side of /otela/http/1: replay a tunnelled request against the local engine and stream the answer back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from opentela._tasks import TaskSet
from opentela._types import Stream
from opentela.errors import (
    EngineCrashedError,
    EngineUnavailableError,
    OpenTelaError,
    ProtocolError,
    UpstreamTimeout,
)
from opentela.fabric.http_tunnel import (
    FORWARDED_RESPONSE_HEADERS,
    MODEL_HEADER,
    RESET_BAD_REQUEST,
    RESET_CANCELLED,
    RESET_ENGINE_CRASHED,
    RESET_ENGINE_TIMEOUT,
    TunnelRequest,
    TunnelResponseHead,
    decode_request,
    encode_response_head,
    read_request,
)
from opentela.node.engine_client import (
    EngineCall,
    EngineClient,
    EngineConnectionError,
    EngineResponse,
    EngineTarget,
)

logger = logging.getLogger(__name__)

_ALLOWED_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",  # passed through only to engines that serve it (vLLM); the ingress translates for the rest
    "/v1/models",
)


class LocalEngineProxy:
    """Forwards requests to the engine on this node over a keep-alive HTTP pool."""

    def __init__(
        self,
        engine_url: Callable[[str | None], EngineTarget | str | None],
        *,
        max_body: int,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
    ) -> None:
        self._engine_url = engine_url
        self._max_body = max_body
        self._http = EngineClient(connect_timeout=connect_timeout, read_timeout=read_timeout)
        self.in_flight = 0
        self.busy: dict[str, int] = {}
        """Requests in flight per engine base URL (a node may run several engines)."""
        self.last_done: dict[str, float] = {}
        """When each engine (base URL) last finished a request (monotonic clock)."""
        self.served = 0
        self.abandoned = 0
        """Requests whose asker reset the stream before the end; their engine requests were closed."""
        self.served_now = 0
        """Requests answered from the engine connection's callback, without a task (`serve_now`)."""
        self._tasks = TaskSet("engine-proxy")
        self._pending: set[_PendingAnswer] = set()

    def __repr__(self) -> str:
        return f"<LocalEngineProxy engine={self._engine_url(None)} in_flight={self.in_flight}>"

    async def aclose(self) -> None:
        """Stop the requests still in flight and close the pooled engine connections."""
        for pending in list(self._pending):
            pending.cancel()
        await self._tasks.aclose()
        await self._http.aclose()

    async def handle_stream(self, stream: Stream) -> None:
        """Handler for /otela/http/1 streams."""
        arrived = time.perf_counter()
        try:
            request = await read_request(stream, self._max_body)
        except (ProtocolError, asyncio.IncompleteReadError) as exc:
            logger.warning("bad tunnel request from %s: %s", stream.remote_peer, exc)
            stream.reset(RESET_BAD_REQUEST, f"bad request: {exc}")
            return
        await self.forward(request, stream, arrived)

    def serve_now(self, stream: Stream) -> bool:
        """Serve a stream whose whole request is already here without a task of its own; False, with nothing
        read, when it is still arriving (then `handle_stream` in a task).

        The request goes to the engine on an idle pooled connection, and an answer that arrives whole goes back
        from the engine connection's callback in one frame with the stream's end: no task, no wake-up between
        the two sockets. Everything else (no idle connection, no engine, a streamed or partial answer, a failure,
        a full send window) goes on in a task, as `forward` does it."""
        arrived = time.perf_counter()
        data = stream.read_all_nowait()
        if data is None:
            return False
        try:
            request = decode_request(data, self._max_body)
        except ProtocolError as exc:
            logger.warning("bad tunnel request from %s: %s", stream.remote_peer, exc)
            stream.reset(RESET_BAD_REQUEST, f"bad request: {exc}")
            return True
        target = self._target(request)
        sent_at = time.perf_counter()
        call = (
            self._http.send_now(
                target, request.method, request.path, request.body, self._engine_headers(request)
            )
            if isinstance(target, EngineTarget)
            else None
        )
        if call is None:
            self._tasks.spawn(self.forward(request, stream, arrived), "engine-request")
            return True
        assert isinstance(target, EngineTarget)
        _PendingAnswer(self, request, stream, call, target.base_url, arrived, sent_at).start()
        return True

    def _target(self, request: TunnelRequest) -> EngineTarget | OpenTelaError:
        """The engine for `request`, or the error that refuses it."""
        model = request.headers.get(MODEL_HEADER)
        target = self._engine_url(model)
        if target is None:
            return EngineUnavailableError(f"no engine on this node serves {model or 'requests'} now")
        if request.path not in _ALLOWED_PATHS:
            return ProtocolError(f"path {request.path} is not forwarded")
        return EngineTarget(target) if isinstance(target, str) else target

    @staticmethod
    def _engine_headers(request: TunnelRequest) -> dict[str, str]:
        headers = dict(request.headers)
        headers["X-Request-Id"] = request.request_id
        return headers

    def _began(self, base: str) -> None:
        self.in_flight += 1
        self.busy[base] = self.busy.get(base, 0) + 1

    def _ended(self, base: str) -> None:
        self.in_flight -= 1
        self.busy[base] -= 1
        self.last_done[base] = time.monotonic()

    async def forward(self, request: TunnelRequest, stream: Stream, arrived: float | None = None) -> None:
        """Send `request` to the engine and write the response head and body to `stream`.

        `arrived` (a perf_counter reading) is when the stream came in: with it, a request that asks for timing
        learns the node's own time as well as the engine's."""
        target = self._target(request)
        if isinstance(target, OpenTelaError):
            await self._write_error(stream, target)
            return
        sent_at = time.perf_counter()
        head_sent = [False]

        async def exchange() -> None:
            async with self._http.request(
                target, request.method, request.path, request.body, self._engine_headers(request)
            ) as resp:
                await self._relay(resp, request, stream, sent_at, arrived, head_sent)

        self._began(target.base_url)
        await self._guarded(exchange(), request, stream, target.base_url, head_sent)

    async def _relay(
        self,
        resp: EngineResponse,
        request: TunnelRequest,
        stream: Stream,
        sent_at: float,
        arrived: float | None,
        head_sent: list[bool],
    ) -> None:
        """Write the engine's answer to `stream`: head and a complete body in one write, else as it comes."""
        head = self._response_head(resp.status, resp.headers, request, sent_at, arrived)
        if resp.content_length is not None:
            # Small, complete bodies go out with the head in one write: one frame, one syscall.
            body = await resp.read()
            head_sent[0] = True
            await stream.write(head + body)
        else:
            await stream.write(head)
            head_sent[0] = True
            async for chunk in resp.chunks():
                await stream.write(chunk)
        await stream.write_eof()

    async def _guarded(
        self,
        exchange: Coroutine[Any, Any, None],
        request: TunnelRequest,
        stream: Stream,
        base: str,
        head_sent: list[bool],
    ) -> None:
        """Run `exchange` (the engine request, begun with `_began`) and map its failures onto the stream: an
        error answer before the head, a reset after it; ends the request's bookkeeping.

        `head_sent` is the exchange's own marker (one element, set once the answer's head is on the stream)."""
        # The asker may give up while the engine is still thinking (a client hung up, the ingress moved on):
        # then stop waiting, and leaving the engine request closes it, which is how vLLM, SGLang and llama.cpp
        # learn to stop generating for nobody.
        task = asyncio.current_task()
        abandoned = False

        def give_up() -> None:
            nonlocal abandoned
            if task is not None and not abandoned:
                abandoned = True
                task.cancel()

        stream.on_abort(give_up)
        try:
            await exchange
            self.served += 1
        except EngineConnectionError as exc:
            logger.warning("engine failed request %s: %r", request.request_id, exc)
            if head_sent[0]:
                stream.reset(RESET_ENGINE_CRASHED, f"engine connection lost: {exc}")
            else:
                await self._write_error(stream, EngineCrashedError(f"engine unreachable: {exc}"))
        except OpenTelaError as exc:
            # The ingress went away (client disconnected or connection lost): leaving the `async with` closes
            # the engine response, which makes the engine stop generating for it.
            logger.debug("tunnel for %s closed early: %r", request.request_id, exc)
        except TimeoutError:
            if head_sent[0]:
                stream.reset(RESET_ENGINE_TIMEOUT, "engine stopped producing output")
            else:
                await self._write_error(stream, UpstreamTimeout("engine did not answer in time"))
        except asyncio.CancelledError:
            if not abandoned or task is None or task.uncancel() > 0:
                # The node is shutting down, not the asker giving up: the asker learns it now, whichever task
                # set ran this (the host's handler tasks reset the stream too; a second reset does nothing).
                stream.reset(RESET_CANCELLED, "serving node shutting down")
                raise
            self.abandoned += 1
            logger.info("request %s abandoned by its asker: engine request closed", request.request_id)
        finally:
            exchange.close()  # never started if the stream was already gone
            stream.on_abort(None)
            self._ended(base)

    @staticmethod
    def _response_head(
        status: int,
        engine_headers: dict[str, str],
        request: TunnelRequest,
        sent_at: float,
        arrived: float | None,
    ) -> bytes:
        """The tunnel's response head for an engine answer: its status, the headers that travel, and the node's
        and engine's times when the request asked for them."""
        headers = {k: engine_headers[k] for k in FORWARDED_RESPONSE_HEADERS if k in engine_headers}
        if not request.timing:
            return encode_response_head(TunnelResponseHead(status, headers))
        now = time.perf_counter()
        engine_us = int((now - sent_at) * 1e6)
        node_us = int((now - arrived) * 1e6) - engine_us if arrived is not None else None
        return encode_response_head(TunnelResponseHead(status, headers, None, engine_us, node_us))

    @staticmethod
    async def _write_error(stream: Stream, err: OpenTelaError) -> None:
        body = json.dumps(err.to_openai()).encode()
        head = TunnelResponseHead(err.status_code, {"content-type": "application/json"}, err.code)
        try:
            await stream.write(encode_response_head(head) + body)
            await stream.write_eof()
        except OpenTelaError:
            pass


class _PendingAnswer:
    """A request of `LocalEngineProxy.serve_now` while its engine answers: finished from the engine connection's
    callback when the answer comes whole, handed to a task when it does not."""

    __slots__ = ("arrived", "base", "call", "head_sent", "proxy", "request", "sent_at", "stream", "timer")

    def __init__(
        self,
        proxy: LocalEngineProxy,
        request: TunnelRequest,
        stream: Stream,
        call: EngineCall,
        base: str,
        arrived: float,
        sent_at: float,
    ) -> None:
        self.proxy, self.request, self.stream, self.call = proxy, request, stream, call
        self.base, self.arrived, self.sent_at = base, arrived, sent_at
        self.head_sent = [False]
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Watch the engine's answer and the asker."""
        self.proxy._pending.add(self)
        self.proxy._began(self.base)
        self.stream.on_abort(self.abort)
        timeout = self.proxy._http.read_timeout
        if timeout is not None:
            self.timer = asyncio.get_running_loop().call_later(timeout, self.expire)
        self.call.listen(self.progress)

    def _stop(self, *, drop: bool = False) -> None:
        """Stop watching; with `drop`, also close the engine connection (the engine sees its client leave)."""
        self.proxy._pending.discard(self)
        self.call.listen(None)
        self.stream.on_abort(None)
        if self.timer is not None:
            self.timer.cancel()
        if drop:
            self.call.abandon()

    def progress(self) -> None:
        """The engine sent something, or its connection is gone."""
        call = self.call
        if call.error is not None:
            self._stop(drop=True)
            if not call.received_any:
                # The engine never saw the request (an idle connection it had closed): `forward` sends it again on
                # a new connection, and reports a failure there as it would any other.
                self.proxy._ended(self.base)
                self.proxy._tasks.spawn(
                    self.proxy.forward(self.request, self.stream, self.arrived), "engine-request"
                )
            else:
                self._hand_over(_raise(call.error))
            return
        if not call.head_done:
            return
        self._stop()
        if not call.complete:
            self._hand_over(self._relay_rest(call.response()))  # streamed, or the body still coming
            return
        head = self.proxy._response_head(call.status, call.headers, self.request, self.sent_at, self.arrived)
        answer = head + call.body()
        call.finish()
        if self.stream.write_last_nowait(answer):
            self.proxy.served += 1
            self.proxy.served_now += 1
            self.proxy._ended(self.base)
        else:
            self._hand_over(self._send(answer))  # no credit for it now: written as the peer grants it

    def abort(self) -> None:
        """The asker reset the stream: the engine request is closed, so the engine stops working for nobody."""
        self._stop(drop=True)
        self.proxy.abandoned += 1
        self.proxy._ended(self.base)
        logger.info("request %s abandoned by its asker: engine request closed", self.request.request_id)

    def cancel(self) -> None:
        """The node is shutting down: the engine request is closed and the stream reset."""
        self._stop(drop=True)
        self.proxy._ended(self.base)
        self.stream.reset(RESET_CANCELLED, "serving node shutting down")

    def expire(self) -> None:
        """The engine said nothing for the read timeout."""
        self._stop(drop=True)
        self._hand_over(_raise(TimeoutError("engine stopped producing output")))

    def _hand_over(self, exchange: Coroutine[Any, Any, None]) -> None:
        proxy = self.proxy
        proxy._tasks.spawn(
            proxy._guarded(exchange, self.request, self.stream, self.base, self.head_sent), "engine-answer"
        )

    async def _relay_rest(self, resp: EngineResponse) -> None:
        try:
            await self.proxy._relay(
                resp, self.request, self.stream, self.sent_at, self.arrived, self.head_sent
            )
        except BaseException:
            self.call.abandon()
            raise
        resp.release()

    async def _send(self, answer: bytes) -> None:
        self.head_sent[0] = True
        await self.stream.write(answer)
        await self.stream.write_eof()


async def _raise(exc: BaseException) -> None:
    raise exc
