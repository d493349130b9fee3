"""A real aiohttp server on a free loopback port, for tests that need an HTTP peer (sinks, stand-in services)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, *, shutdown_timeout: float = 60.0) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at a free port; yields its base URL (http://127.0.0.1:PORT)."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
