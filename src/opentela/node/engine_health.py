"""Engine health watching: periodic checks of a serving engine, and the verdict that it is beyond saving."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp

logger = logging.getLogger(__name__)


class HealthVerdict:
    """Counts health-check results; says why the engine is fatally unhealthy, or None while it may recover.

    Two limits, either of which may be 0 (off): `failures` consecutive failed checks, and `unhealthy_limit`
    seconds since the last passing check (or since watching began). No I/O: the caller passes the clock.
    """

    def __init__(self, failures: int, unhealthy_limit: float, now: float) -> None:
        self.failures = failures
        self.unhealthy_limit = unhealthy_limit
        self.consecutive = 0
        self.last_ok = now

    def __repr__(self) -> str:
        return f"<HealthVerdict failed={self.consecutive}/{self.failures} last_ok={self.last_ok:.1f}>"

    def record(self, ok: bool, now: float) -> str | None:
        """Count one check's result at time `now`; the reason to fail-stop, if this result makes it fatal."""
        if ok:
            self.consecutive = 0
            self.last_ok = now
            return None
        self.consecutive += 1
        if self.failures and self.consecutive >= self.failures:
            return f"engine failed {self.consecutive} consecutive health checks"
        unhealthy_for = now - self.last_ok
        if self.unhealthy_limit and unhealthy_for >= self.unhealthy_limit:
            return f"engine unhealthy for {unhealthy_for:.1f} s (limit {self.unhealthy_limit:g} s)"
        return None


async def check_http(http: aiohttp.ClientSession, url: str, timeout: float) -> bool:
    """One health check: GET `url` answers 200 within `timeout` seconds."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def watch_health(
    check: Callable[[], Awaitable[bool]],
    *,
    interval: float,
    failures: int,
    unhealthy_limit: float,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Run `check` every `interval` seconds (start to start) until the verdict is fatal; return its reason."""
    verdict = HealthVerdict(failures, unhealthy_limit, clock())
    while True:
        started = clock()
        ok = await check()
        reason = verdict.record(ok, clock())
        if reason is not None:
            return reason
        if not ok:
            logger.warning(
                "engine health check failed",
                extra={
                    "consecutive": verdict.consecutive,
                    "unhealthy_s": round(clock() - verdict.last_ok, 1),
                },
            )
        await asyncio.sleep(max(0.0, interval - (clock() - started)))
