"""The gateway's adapter of the OpenAI edge: request ids and OpenAI error JSON for every aiohttp answer, and
CORS for the `/v1` API when the ingress allows some origins."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler

from opentela import cors
from opentela import openai_edge as edge
from opentela.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    OpenTelaError,
    OriginNotAllowedError,
    RequestTooLargeError,
)
from opentela.gateway.responses import RESPONSES_PATH
from opentela.gateway.state import REQUEST_ID_KEY

logger = logging.getLogger(__name__)


def error_response(err: OpenTelaError, *, request_id: str | None = None) -> web.Response:
    """`err` rendered by the edge as an aiohttp response."""
    status, headers, body = edge.render_error(err, request_id)
    return web.Response(status=status, body=body, headers=headers, content_type=edge.JSON_CONTENT_TYPE)


def map_http_exception(exc: web.HTTPException) -> OpenTelaError:
    """Translate aiohttp's own HTTP exceptions (routing, body size) into our error tree."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return RequestTooLargeError(f"request body too large: {exc.text}")
    if isinstance(exc, web.HTTPNotFound):
        paths = ", ".join((*edge.INFERENCE_PATHS, RESPONSES_PATH))
        return NotFoundError(f"no such route; see /v1/models, {paths}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return MethodNotAllowedError(f"method not allowed; use {allowed}", allow=allowed)
    err = InvalidRequestError(exc.text or exc.reason)
    err.status_code = exc.status
    return err


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id that travels end to end (the client's X-Request-Id when sane), and render
    OpenTelaError and aiohttp HTTP errors as OpenAI JSON; log and hide anything unexpected."""
    request_id = edge.request_id(request.headers.get(edge.REQUEST_ID_HEADER))
    request[REQUEST_ID_KEY] = request_id
    try:
        response = await handler(request)
    except OpenTelaError as err:
        return error_response(err, request_id=request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(map_http_exception(exc), request_id=request_id)
    except Exception:
        logger.exception("unhandled error on %s %s (request %s)", request.method, request.path, request_id)
        return error_response(OpenTelaError("internal error"), request_id=request_id)
    if not response.prepared:
        for name in edge.ANSWER_ID_HEADERS:
            response.headers.setdefault(name, request_id)
    return response


# --- CORS ---------------------------------------------------------------------------------------------------
# Installed only when `cors_origins` allows some origin; with CORS off the app has neither. The fast edge adds the
# answer headers to the inference POSTs it serves itself (gateway/fast_edge.py); preflights, GETs and the
# connections it hands over are aiohttp's, and get them here.


def cors_middleware(policy: cors.CorsPolicy) -> Any:
    """Answer a preflight to a `/v1` path: 204 with the CORS headers when its origin is allowed, else 403 (inside
    `edge_middleware`, which renders the error and adds the request id)."""

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if not cors.is_preflight(
            request.method, origin, request.headers.get(cors.REQUEST_METHOD)
        ) or not request.path.startswith(cors.API_PREFIX):
            return await handler(request)
        assert origin is not None
        headers = policy.preflight_headers(origin, request.headers.get(cors.REQUEST_HEADERS))
        if headers is None:
            raise OriginNotAllowedError(cors.refusal_message(origin))
        return web.Response(status=204, headers=headers)

    return preflight


def cors_headers_hook(
    policy: cors.CorsPolicy,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An `on_response_prepare` hook adding the CORS headers to every answer (streams included) to a `/v1`
    request from an allowed origin."""

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        if not request.path.startswith(cors.API_PREFIX) or cors.ALLOW_ORIGIN in response.headers:
            return  # not the API, or a preflight's own answer
        headers = policy.answer_headers(request.headers.get("Origin"))
        if headers is None:
            return
        for name, value in headers.items():
            if name == "Vary":
                response.headers.add(name, value)
            else:
                response.headers[name] = value

    return add_headers


# --- connection deadlines -----------------------------------------------------------------------------------
# aiohttp closes a connection that has not delivered a complete request head `keepalive_timeout` seconds after
# connecting or after its previous response (its keep-alive timer is not reset by partial headers), but it has
# no separate, shorter deadline for a head that has started to arrive: a client sending one header byte a second
# would hold its connection for the whole keep-alive time. These two classes add that deadline.


class _HeadDeadlineHandler(RequestHandler):
    """aiohttp's connection handler, closing a connection whose request head is not complete within
    `header_timeout` seconds of its first byte."""

    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._heads_at_arm = 0

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:  # a head completed: the deadline is met
            self._disarm()
        elif self._head_timer is None and self._awaiting_head():
            self._heads_at_arm = self._request_count
            self._head_timer = asyncio.get_running_loop().call_later(self._header_timeout, self._head_overdue)

    def _awaiting_head(self) -> bool:
        # Between requests aiohttp's handler waits on `_waiter` for the next parsed message.
        return self._waiter is not None and not self._waiter.done()

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._request_count == self._heads_at_arm and self._awaiting_head():
            logger.debug("closing a connection whose request head took over %.0f s", self._header_timeout)
            self.force_close()

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class _HeadDeadlineServer(web.Server):
    """aiohttp's low-level server, making `_HeadDeadlineHandler`s."""

    def __init__(self, template: web.Server, header_timeout: float) -> None:
        super().__init__(
            template.request_handler,
            request_factory=template.request_factory,
            handler_cancellation=template.handler_cancellation,
            loop=template._loop,
            **template._kwargs,
        )
        self._header_timeout = header_timeout

    def __call__(self) -> RequestHandler:
        return _HeadDeadlineHandler(
            self, loop=self._loop, header_timeout=self._header_timeout, **self._kwargs
        )


class EdgeRunner(web.AppRunner):
    """An AppRunner whose connections must complete each request head within `header_timeout` seconds of its
    first byte; pass aiohttp's `keepalive_timeout` for how long an idle connection may stay open."""

    def __init__(self, app: web.Application, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        return _HeadDeadlineServer(await super()._make_server(), self._header_timeout)
