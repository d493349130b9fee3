"""One structured access-log line per request, carrying the request id and the node that served it."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from opentela import openai_edge as edge
from opentela.gateway.call import Call
from opentela.gateway.state import CALL_KEY, REQUEST_ID_KEY

access_logger = logging.getLogger("opentela.gateway.access")
"""The access log's logger (INFO for success, WARNING for 5xx)."""


def log_access(
    method: str,
    path: str,
    status: int,
    sent: int | None,
    seconds: float,
    request_id: str,
    node: str,
    call: Call | None,
    remote: str | None,
    logger: logging.Logger = access_logger,
) -> None:
    """Write one access-log line: method, path, status, bytes, duration, request id, serving node, and for
    inference requests the model, the attempts it took and the policy."""
    level = logging.WARNING if status >= 500 else logging.INFO
    if not logger.isEnabledFor(level):
        return
    route = (
        {"model": call.model, "attempts": len(call.tried), "policy": call.routing.policy_name}
        if call is not None
        else {}
    )
    logger.log(
        level,
        "%s %s %d",
        method,
        path,
        status,
        extra={
            **route,
            "request_id": request_id,
            "node": node[-8:],
            "bytes": sent,
            "ms": round(seconds * 1000, 3),
            "remote": remote,
        },
    )


class GatewayAccessLogger(AbstractAccessLogger):
    """The access log of requests aiohttp served (`log_access`' line)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write the line."""
        log_access(
            request.method,
            request.path,
            response.status,
            response.body_length,
            time,
            response.headers.get(edge.RESPONSE_ID_HEADER) or request.get(REQUEST_ID_KEY, "-"),
            response.headers.get("X-Otela-Node", "-"),
            request.get(CALL_KEY),
            request.remote,
            self.logger,
        )

    @property
    def enabled(self) -> bool:
        """Skip the work when the logger is off."""
        return self.logger.isEnabledFor(logging.INFO)
