"""One structured access-log line per request, carrying the request id and the node that served it."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from opentela import openai_edge as edge
from opentela.gateway.state import CALL_KEY, REQUEST_ID_KEY


class GatewayAccessLogger(AbstractAccessLogger):
    """method, path, status, bytes, duration, request id, serving node, and for inference requests the model,
    the attempts it took and the policy; INFO for success, WARNING for 5xx."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write the line."""
        status = response.status
        level = logging.WARNING if status >= 500 else logging.INFO
        if not self.logger.isEnabledFor(level):
            return
        call = request.get(CALL_KEY)
        route = (
            {"model": call.model, "attempts": len(call.tried), "policy": call.routing.policy_name}
            if call is not None
            else {}
        )
        self.logger.log(
            level,
            "%s %s %d",
            request.method,
            request.path,
            status,
            extra={
                **route,
                "request_id": response.headers.get(edge.RESPONSE_ID_HEADER)
                or request.get(REQUEST_ID_KEY, "-"),
                "node": response.headers.get("X-Otela-Node", "-")[-8:],
                "bytes": response.body_length,
                "ms": round(time * 1000, 3),
                "remote": request.remote,
            },
        )

    @property
    def enabled(self) -> bool:
        """Skip the work when the logger is off."""
        return self.logger.isEnabledFor(logging.INFO)
