"""The FastAPI application of the frontend: routes, error rendering, static dashboard, request logging."""

from __future__ import annotations

import base64
import hashlib
import inspect
import logging
import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from opentela import __version__, cors
from opentela import openai_edge as edge
from opentela.errors import OriginNotAllowedError
from opentela.frontend.access_log import AccessLogMiddleware
from opentela.frontend.error_handlers import install_error_handlers
from opentela.frontend.login import Login
from opentela.frontend.routes import admin, auth, dashboard, me, openai
from opentela.frontend.routes.dashboard import STATIC
from opentela.frontend.state import FrontendState

logger = logging.getLogger(__name__)

DESCRIPTION = """
OpenAI-compatible API in front of an OpenTela ingress: every request is authenticated with an API key, checked
against the key's rate limits and budget, forwarded to the mesh and metered (one usage row per request).
Management endpoints under `/admin` need the admin token; `/api/me` is the self-service of users who logged in
with OpenID Connect (`/auth/login`). Errors use the OpenAI error JSON shape.
"""


# The dashboard loads only its own script, style sheet and icon, and talks only to this origin.
DASHBOARD_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def _docs_csp(page: str) -> str:
    """The policy of the API reference: Swagger UI starts from one inline script, allowed by its hash."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    )
    # Swagger UI sets inline style attributes in the markup it renders; styles cannot run code.
    return (
        f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )


class SecurityHeadersMiddleware:
    """Adds a Content-Security-Policy, X-Frame-Options DENY, nosniff and Referrer-Policy to every answer
    (ASGI, so streamed answers pass through untouched)."""

    def __init__(self, app: Any, docs_csp: str) -> None:
        self.app, self.docs_csp = app, docs_csp.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = self.docs_csp if scope.get("path") == "/docs" else DASHBOARD_CSP.encode()

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    *(message.get("headers") or ()),
                    *SECURITY_HEADERS,
                    (b"content-security-policy", csp),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class HeadAsGetMiddleware:
    """Answers HEAD wherever GET is served, with the GET answer's status and headers and no body (RFC 9110 9.3.2):
    FastAPI routes declared with GET do not take HEAD themselves."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        body_sent = False

        async def send_head(message: dict[str, Any]) -> None:
            nonlocal body_sent
            if message["type"] != "http.response.body":
                await send(message)
            elif not body_sent:
                body_sent = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, send_head)


class TrailingSlashMiddleware:
    """Serves `/v1/models/` as `/v1/models`: no route ends in a slash, and the redirect the framework would answer
    with makes clients resend a POST as a GET (or not at all)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
            raw = scope.get("raw_path")
            if isinstance(raw, bytes):
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class CorsMiddleware:
    """CORS for the `/v1` API (opentela/cors.py): answers a preflight from an allowed origin with 204 (403 from
    another), and adds the CORS headers to every answer, streamed ones included, to a request from an allowed
    origin. Requests without an Origin, and every other path, pass through untouched."""

    def __init__(self, app: Any, policy: cors.CorsPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(cors.API_PREFIX):
            await self.app(scope, receive, send)
            return
        wanted = {b"origin": "", b"access-control-request-method": "", b"access-control-request-headers": ""}
        found: dict[bytes, str] = {}
        for name, value in scope.get("headers") or ():
            if name in wanted and name not in found:
                found[name] = value.decode("latin-1")
        origin = found.get(b"origin")
        if cors.is_preflight(scope.get("method", ""), origin, found.get(b"access-control-request-method")):
            assert origin is not None
            await self._preflight(origin, found.get(b"access-control-request-headers"), scope, send)
            return
        headers = self.policy.answer_headers(origin)
        if headers is None:
            await self.app(scope, receive, send)
            return
        extra = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]

        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*(message.get("headers") or ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, origin: str, requested: str | None, scope: dict[str, Any], send: Any) -> None:
        headers = self.policy.preflight_headers(origin, requested)
        if headers is None:
            request_id = scope.get("state", {}).get("request_id")
            status, err_headers, body = edge.render_error(
                OriginNotAllowedError(cors.refusal_message(origin)), request_id
            )
            out = {**err_headers, "Content-Type": edge.JSON_CONTENT_TYPE, "Content-Length": str(len(body))}
        else:
            status, body, out = 204, b"", headers
        raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in out.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _docs_page() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="OpenTela frontend API",
        swagger_js_url="/docs-assets/swagger-ui-bundle.js",
        swagger_css_url="/docs-assets/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
    )


def _without_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry instrumentation turned off where it exists (newer FastAPI releases): the
    frontend keeps its own access log and usage rows, and the spans cost time on every request."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}


def create_app(state: FrontendState, login: Login) -> FastAPI:
    """The application over shared `state`, with `login` for users' sessions and self-service."""
    # The API reference is served from a packaged Swagger UI: the dashboard must work with no internet access.
    app = FastAPI(
        title="OpenTela frontend",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        **_without_telemetry(),
    )
    app.state.frontend = state
    app.state.login = login
    # Innermost first: the access log sees the request as sent (and names it before CORS answers a preflight);
    # the security headers (the API reference's own policy) and the routes see its path without a trailing slash,
    # and the routes see HEAD as GET.
    app.router.redirect_slashes = False
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(SecurityHeadersMiddleware, docs_csp=_docs_csp(bytes(_docs_page().body).decode()))
    app.add_middleware(TrailingSlashMiddleware)
    policy = state.config.cors_policy()
    if policy is not None:
        app.add_middleware(CorsMiddleware, policy=policy)
    app.add_middleware(AccessLogMiddleware)
    install_error_handlers(app)
    app.include_router(openai.router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.include_router(auth.router)
    app.include_router(me.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return _docs_page()

    return app
