"""Request ids and one structured access-log line per request (ASGI middleware: streams are logged when they end)."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentela import openai_edge as edge

logger = logging.getLogger("opentela.frontend.access")

Scope = dict[str, Any]


class AccessLogMiddleware:
    """Gives every request an id (the client's sane X-Request-Id, else a fresh one), returns it as
    X-Otela-Request-Id, and logs method, path, status, duration and serving node."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        request_id = edge.request_id(headers.get(b"x-request-id", b"").decode("latin-1"))
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 0, "node": "-"}

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                out = list(message.get("headers") or ())
                names = {k.lower() for k, _ in out}
                if b"x-otela-request-id" not in names:
                    out.append((b"x-otela-request-id", request_id.encode()))
                seen["node"] = next((v.decode()[-8:] for k, v in out if k.lower() == b"x-otela-node"), "-")
                message = {**message, "headers": out}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            status = seen["status"]
            path = scope.get("path", "")
            if not path.startswith(("/static/", "/docs-assets/")):
                level = logging.WARNING if status >= 500 or status == 0 else logging.INFO
                logger.log(
                    level,
                    "%s %s %d",
                    scope.get("method", "-"),
                    path,
                    status,
                    extra={
                        "request_id": request_id,
                        "node": seen["node"],
                        "ms": round((time.perf_counter() - started) * 1000, 3),
                    },
                )
