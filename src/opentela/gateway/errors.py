"""One place that turns every failure into the OpenAI error JSON with the right status."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from opentela.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    OpenTelaError,
    RequestTooLargeError,
)
from opentela.gateway._keys import REQUEST_ID_KEY

logger = logging.getLogger(__name__)


def error_response(err: OpenTelaError, *, request_id: str | None = None) -> web.Response:
    """An OpenAI-shaped JSON error response; 429/503 carry Retry-After so SDKs back off."""
    headers = {}
    if request_id:
        headers["X-Otela-Request-Id"] = request_id
    if err.status_code in (429, 503):
        headers["Retry-After"] = str(err.details.get("retry_after", 1))
    return web.Response(
        status=err.status_code,
        body=json.dumps(err.to_openai()).encode(),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(err: OpenTelaError) -> bytes:
    """The SSE event that ends a stream which already started: the status line can no longer change."""
    return b"data: " + json.dumps(err.to_openai()).encode() + b"\n\n"


def map_http_exception(exc: web.HTTPException) -> OpenTelaError:
    """Translate aiohttp's own HTTP exceptions (routing, body size) into our error tree."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return RequestTooLargeError(f"request body too large: {exc.text}")
    if isinstance(exc, web.HTTPNotFound):
        return NotFoundError(
            "no such route; see /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings"
        )
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowedError(f"method not allowed; use {', '.join(sorted(exc.allowed_methods))}")
    err = InvalidRequestError(exc.text or exc.reason)
    err.status_code = exc.status
    return err


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Render OpenTelaError and aiohttp HTTP errors as OpenAI JSON; log and hide anything unexpected."""
    try:
        return await handler(request)
    except OpenTelaError as err:
        return error_response(err, request_id=request.get(REQUEST_ID_KEY))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(map_http_exception(exc), request_id=request.get(REQUEST_ID_KEY))
    except Exception:
        logger.exception(
            "unhandled error on %s %s (request %s)", request.method, request.path, request.get(REQUEST_ID_KEY)
        )
        return error_response(OpenTelaError("internal error"), request_id=request.get(REQUEST_ID_KEY))
