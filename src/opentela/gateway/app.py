"""The ingress gateway: an aiohttp application serving the OpenAI API over the node's mesh view."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from opentela import openai_edge as edge
from opentela.gateway._config import GatewayConfig
from opentela.gateway.access_log import GatewayAccessLogger, access_logger
from opentela.gateway.edge import EdgeRunner, cors_headers_hook, cors_middleware, edge_middleware
from opentela.gateway.fast_edge import FastEdgeServer
from opentela.gateway.mesh import Mesh
from opentela.gateway.responses import RESPONSES_PATH
from opentela.gateway.routes import infra
from opentela.gateway.routes.inference import handle_inference
from opentela.gateway.state import STATE_KEY, GatewayState

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 60.0
"""Seconds requests in progress get to finish when the gateway closes (aiohttp's own default)."""


class Gateway:
    """Serves the OpenAI-compatible API and the read-only infrastructure endpoints of one ingress node."""

    def __init__(self, mesh: Mesh, config: GatewayConfig | None = None) -> None:
        self.state = GatewayState.build(mesh, config or GatewayConfig())
        # The parts, for operators and tests; routes reach them through `state_of(request)`.
        self.mesh, self.config = mesh, self.state.config
        self.router, self.forwarder, self.metrics = (
            self.state.router,
            self.state.forwarder,
            self.state.metrics,
        )
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._edge: FastEdgeServer | None = None
        self.url: str = ""
        self.app = self._build_app()

    def __repr__(self) -> str:
        return f"<Gateway {self.url or 'not listening'} policy={self.config.policy}>"

    def _build_app(self) -> web.Application:
        cors = self.config.cors_policy()
        middlewares = [edge_middleware] if cors is None else [edge_middleware, cors_middleware(cors)]
        app = web.Application(middlewares=middlewares, client_max_size=self.config.max_body_bytes)
        app[STATE_KEY] = self.state
        if cors is not None:
            app.on_response_prepare.append(cors_headers_hook(cors))
        for path in (*edge.INFERENCE_PATHS, RESPONSES_PATH):
            app.router.add_post(path, handle_inference)
        app.router.add_get("/v1/models", infra.list_models)
        app.router.add_get("/v1/models/{model:.+}", infra.get_model)
        app.router.add_get("/v1/dnt/table", infra.dnt_table)
        app.router.add_get("/v1/dnt/names", infra.dnt_names)
        app.router.add_get("/v1/dnt/peers", infra.dnt_peers)
        app.router.add_get("/v1/dnt/rtt", infra.dnt_rtt)
        app.router.add_get("/v1/dnt/bootstraps", infra.dnt_bootstraps)
        app.router.add_get("/v1/dnt/stats", infra.dnt_stats)
        app.router.add_get("/v1/dnt/serverless", infra.dnt_serverless)
        app.router.add_get("/v1/health", infra.health)
        app.router.add_get("/metrics", infra.metrics)
        return app

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (0 picks a free port); returns the base URL."""
        self._runner = EdgeRunner(
            self.app,
            header_timeout=self.config.header_timeout,
            keepalive_timeout=self.config.keepalive_timeout,
            access_log=access_logger,
            access_log_class=GatewayAccessLogger,
            handle_signals=False,
            # A client that hangs up cancels its handler: the forwarder then resets the mesh stream, and the
            # serving node closes its engine request (see node/http_service.py). Streams also notice on write.
            handler_cancellation=True,
        )
        await self._runner.setup()
        # Inference requests are served by the gateway's own HTTP edge; it hands every other request, with the
        # rest of its connection, to aiohttp's handler (gateway/fast_edge.py).
        assert self._runner.server is not None
        self._edge = FastEdgeServer(
            self.state,
            self._runner.server,
            keepalive_timeout=self.config.keepalive_timeout,
            header_timeout=self.config.header_timeout,
            max_body_bytes=self.config.max_body_bytes,
            cors=self.config.cors_policy(),
        )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._edge, host or None, port, reuse_address=True)
        bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else port
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{bound_port}"
        logger.info("gateway listening on %s", self.url)
        return self.url

    async def aclose(self) -> None:
        """Stop listening and finish the requests in progress (up to aiohttp's shutdown timeout)."""
        if self._server is not None:
            self._server.close()
            assert self._edge is not None
            await self._edge.shutdown(SHUTDOWN_TIMEOUT)
            await self._server.wait_closed()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Gateway:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
