"""Serving side of /otela/http/1: replay a tunnelled request against the local engine and stream the answer back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

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
    RESET_ENGINE_CRASHED,
    RESET_ENGINE_TIMEOUT,
    TunnelRequest,
    TunnelResponseHead,
    encode_response_head,
    read_request,
)
from opentela.node.engine_client import EngineClient, EngineConnectionError, EngineTarget

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

    def __repr__(self) -> str:
        return f"<LocalEngineProxy engine={self._engine_url(None)} in_flight={self.in_flight}>"

    async def aclose(self) -> None:
        """Close the pooled engine connections."""
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

    async def forward(self, request: TunnelRequest, stream: Stream, arrived: float | None = None) -> None:
        """Send `request` to the engine and write the response head and body to `stream`.

        `arrived` (a perf_counter reading) is when the stream came in: with it, a request that asks for timing
        learns the node's own time as well as the engine's."""
        model = request.headers.get(MODEL_HEADER)
        target = self._engine_url(model)
        if target is None or request.path not in _ALLOWED_PATHS:
            err: OpenTelaError = (
                EngineUnavailableError(f"no engine on this node serves {model or 'requests'} now")
                if target is None
                else ProtocolError(f"path {request.path} is not forwarded")
            )
            await self._write_error(stream, err)
            return
        if isinstance(target, str):
            target = EngineTarget(target)
        base = target.base_url
        headers = dict(request.headers)
        headers["X-Request-Id"] = request.request_id
        self.in_flight += 1
        self.busy[base] = self.busy.get(base, 0) + 1
        head_sent = False
        sent_at = time.perf_counter()
        # The asker may give up while the engine is still thinking (a client hung up, the ingress moved on):
        # then stop waiting, and leaving the engine request below closes it, which is how vLLM, SGLang and
        # llama.cpp learn to stop generating for nobody.
        task = asyncio.current_task()
        abandoned = False

        def give_up() -> None:
            nonlocal abandoned
            if task is not None and not abandoned:
                abandoned = True
                task.cancel()

        stream.on_abort(give_up)
        try:
            async with self._http.request(
                target, request.method, request.path, request.body, headers
            ) as resp:
                out_headers = {k: resp.headers[k] for k in FORWARDED_RESPONSE_HEADERS if k in resp.headers}
                if resp.content_length is not None:
                    # Small, complete bodies go out with the head in one write: one frame, one syscall.
                    body = await resp.read()
                    head = encode_response_head(
                        self._head(resp.status, out_headers, request, sent_at, arrived)
                    )
                    head_sent = True
                    await stream.write(head + body)
                else:
                    head = encode_response_head(
                        self._head(resp.status, out_headers, request, sent_at, arrived)
                    )
                    await stream.write(head)
                    head_sent = True
                    async for chunk in resp.chunks():
                        await stream.write(chunk)
            await stream.write_eof()
            self.served += 1
        except EngineConnectionError as exc:
            logger.warning("engine failed request %s: %r", request.request_id, exc)
            if head_sent:
                stream.reset(RESET_ENGINE_CRASHED, f"engine connection lost: {exc}")
            else:
                await self._write_error(stream, EngineCrashedError(f"engine unreachable: {exc}"))
        except OpenTelaError as exc:
            # The ingress went away (client disconnected or connection lost): leaving the `async with` closes
            # the engine response, which makes the engine stop generating for it.
            logger.debug("tunnel for %s closed early: %r", request.request_id, exc)
        except TimeoutError:
            if head_sent:
                stream.reset(RESET_ENGINE_TIMEOUT, "engine stopped producing output")
            else:
                await self._write_error(stream, UpstreamTimeout("engine did not answer in time"))
        except asyncio.CancelledError:
            if not abandoned or task is None or task.uncancel() > 0:
                raise  # the node is shutting down, not the asker giving up
            self.abandoned += 1
            logger.info("request %s abandoned by its asker: engine request closed", request.request_id)
        finally:
            stream.on_abort(None)
            self.in_flight -= 1
            self.busy[base] -= 1
            self.last_done[base] = time.monotonic()

    @staticmethod
    def _head(
        status: int, headers: dict[str, str], request: TunnelRequest, sent_at: float, arrived: float | None
    ) -> TunnelResponseHead:
        if not request.timing:
            return TunnelResponseHead(status, headers)
        now = time.perf_counter()
        engine_us = int((now - sent_at) * 1e6)
        node_us = int((now - arrived) * 1e6) - engine_us if arrived is not None else None
        return TunnelResponseHead(status, headers, None, engine_us, node_us)

    @staticmethod
    async def _write_error(stream: Stream, err: OpenTelaError) -> None:
        body = json.dumps(err.to_openai()).encode()
        head = TunnelResponseHead(err.status_code, {"content-type": "application/json"}, err.code)
        try:
            await stream.write(encode_response_head(head) + body)
            await stream.write_eof()
        except OpenTelaError:
            pass
