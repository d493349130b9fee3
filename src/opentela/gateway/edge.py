"""The gateway's adapter of the OpenAI edge: request ids and OpenAI error JSON for every aiohttp answer."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from opentela import openai_edge as edge
from opentela.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    OpenTelaError,
    RequestTooLargeError,
)
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
        return NotFoundError(f"no such route; see /v1/models, {', '.join(edge.INFERENCE_PATHS)}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowedError(f"method not allowed; use {', '.join(sorted(exc.allowed_methods))}")
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
        response.headers.setdefault(edge.RESPONSE_ID_HEADER, request_id)
    return response
