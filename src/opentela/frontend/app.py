"""The FastAPI application of the frontend: routes, error rendering, static dashboard, request logging."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from opentela import __version__
from opentela.frontend.access_log import AccessLogMiddleware
from opentela.frontend.error_handlers import install_error_handlers
from opentela.frontend.routes import admin, dashboard, openai
from opentela.frontend.routes.dashboard import STATIC
from opentela.frontend.state import FrontendState

logger = logging.getLogger(__name__)

DESCRIPTION = """
OpenAI-compatible API in front of an OpenTela ingress: every request is authenticated with an API key, checked
against the key's rate limits and budget, forwarded to the mesh and metered (one usage row per request).
Management endpoints under `/admin` need the admin token. Errors use the OpenAI error JSON shape.
"""


def create_app(state: FrontendState) -> FastAPI:
    """The application over shared `state`."""
    # The API reference is served from a packaged Swagger UI: the dashboard must work with no internet access.
    app = FastAPI(
        title="OpenTela frontend", version=__version__, description=DESCRIPTION, docs_url=None, redoc_url=None
    )
    app.state.frontend = state
    app.add_middleware(AccessLogMiddleware)
    install_error_handlers(app)
    app.include_router(openai.router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="OpenTela frontend API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/static/favicon.svg",
        )

    return app
