"""The FastAPI application of the frontend: routes, error rendering, static dashboard, request logging."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from opentela import __version__
from opentela.frontend.errors import install_error_handlers
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
    app = FastAPI(title="OpenTela frontend", version=__version__, description=DESCRIPTION)
    app.state.frontend = state
    install_error_handlers(app)
    app.include_router(openai.router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
