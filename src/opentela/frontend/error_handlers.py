"""Every failure of the frontend leaves as OpenAI error JSON with the right status (and limit details)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, ProgrammingError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from opentela import openai_edge as edge
from opentela.errors import InvalidRequestError, OpenTelaError
from opentela.frontend.errors import ACCEPTED_ENCODINGS

logger = logging.getLogger(__name__)


class DatabaseUnavailableError(OpenTelaError):
    """The usage database does not answer: nothing is forwarded unmetered."""

    status_code = 503
    error_type = "service_unavailable"
    code = "database_unavailable"
    retryable = True


STATUS_HEADERS: dict[int, dict[str, str]] = {
    401: {"WWW-Authenticate": "Bearer"},  # RFC 9110 11.6.1: a 401 names the scheme that would be accepted
    415: {"Accept-Encoding": ACCEPTED_ENCODINGS},  # RFC 9110 15.5.16: the codings that would be
}


def error_response(
    err: OpenTelaError, request_id: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """`err` rendered by the edge (limit errors carry Retry-After and the reset time) as a Starlette response,
    with the headers its status calls for and any `headers` given."""
    status, rendered, body = edge.render_error(err, request_id)
    rendered = {**rendered, **STATUS_HEADERS.get(status, {}), **(headers or {})}
    return Response(body, status_code=status, media_type=edge.JSON_CONTENT_TYPE, headers=rendered)


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (the framework names only the first route's), with
    HEAD wherever GET is (HeadAsGetMiddleware answers it)."""
    routes = request.app.router.routes
    methods = {
        m
        for m in _METHODS
        if any(route.matches({**request.scope, "method": m})[0] == Match.FULL for route in routes)
    }
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app can raise leaves as OpenAI error JSON with the right status."""

    async def on_otela(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenTelaError)
        request_id = getattr(request.state, "request_id", None)
        logger.info(
            "%s %s refused with %d %s (request %s): %s",
            request.method,
            request.url.path,
            exc.status_code,
            exc.code,
            request_id,
            exc.message,
        )
        return error_response(exc, request_id)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        err = InvalidRequestError(str(exc.detail))
        err.status_code = exc.status_code
        err.code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return error_response(err, getattr(request.state, "request_id", None), headers)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        err = InvalidRequestError(f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where or None)
        return error_response(err, getattr(request.state, "request_id", None))

    async def on_database(request: Request, exc: Exception) -> Response:
        if isinstance(exc, (DataError, IntegrityError, ProgrammingError)):
            return await on_unexpected(request, exc)  # a bug of ours, not an outage
        logger.error("database error on %s %s: %s", request.method, request.url.path, exc)
        err = DatabaseUnavailableError(
            "the usage database is not answering; the request was not forwarded", retry_after=5.0
        )
        return error_response(err, getattr(request.state, "request_id", None))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(OpenTelaError("internal error"), getattr(request.state, "request_id", None))

    app.add_exception_handler(OpenTelaError, on_otela)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(DBAPIError, on_database)
    app.add_exception_handler(Exception, on_unexpected)
