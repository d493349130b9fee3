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
    seconds since the last passing check (or since watching began). Failed checks closer together than
    `spacing` seconds count as one toward `failures`, so checking more often (to read the engine's state) does
    not make the node quicker to give up. No I/O: the caller passes the clock.
    """

    def __init__(self, failures: int, unhealthy_limit: float, now: float, spacing: float = 0.0) -> None:
        self.failures = failures
        self.unhealthy_limit = unhealthy_limit
        self.spacing = spacing
        self.consecutive = 0
        self.last_ok = now
        self._last_counted = now

    def __repr__(self) -> str:
        return f"<HealthVerdict failed={self.consecutive}/{self.failures} last_ok={self.last_ok:.1f}>"

    def record(self, ok: bool, now: float) -> str | None:
        """Count one check's result at time `now`; the reason to fail-stop, if this result makes it fatal."""
        if ok:
            self.consecutive = 0
            self.last_ok = now
            return None
        if self.consecutive == 0 or now - self._last_counted >= self.spacing:
            self.consecutive += 1
            self._last_counted = now
        if self.failures and self.consecutive >= self.failures:
            return f"engine failed {self.consecutive} consecutive health checks"
        unhealthy_for = now - self.last_ok
        if self.unhealthy_limit and unhealthy_for >= self.unhealthy_limit:
            return f"engine unhealthy for {unhealthy_for:.1f} s (limit {self.unhealthy_limit:g} s)"
        return None


async def check_http(http: aiohttp.ClientSession, url: str, timeout: float) -> bytes | None:
    """One health check: the body when GET `url` answers 200 within `timeout` seconds, else None."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.read()
            return body if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def watch_health(
    check: Callable[[], Awaitable[bool]],
    *,
    interval: float,
    failures: int,
    unhealthy_limit: float,
    every: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Run `check` every `every` seconds (`interval` when 0 or longer; start to start) until the verdict is fatal;
    return its reason. Failures closer together than `interval` count once toward `failures`."""
    period = every if 0 < every < interval or interval <= 0 else interval
    verdict = HealthVerdict(failures, unhealthy_limit, clock(), spacing=interval)
    while True:
        started = clock()
        ok = await check()
        counted = verdict.consecutive
        reason = verdict.record(ok, clock())
        if reason is not None:
            return reason
        if not ok and verdict.consecutive != counted:
            logger.warning(
                "engine health check failed",
                extra={
                    "consecutive": verdict.consecutive,
                    "unhealthy_s": round(clock() - verdict.last_ok, 1),
                },
            )
        await asyncio.sleep(max(0.0, period - (clock() - started)))
