"""The log sink: where a node that fail-stops sends its last words (engine log tail and its own recent log)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from opentela.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RecentLogs(logging.Handler):
    """Keeps the last `capacity` formatted log records in memory, for a fail-stop report."""

    def __init__(self, capacity: int = 200, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.records: collections.deque[str] = collections.deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        """Format and keep one record (the oldest drops out)."""
        try:
            self.records.append(self.format(record))
        except Exception:
            self.handleError(record)

    def tail(self, n: int) -> list[str]:
        """The last `n` records, oldest first."""
        return list(self.records)[-n:] if n > 0 else []


@dataclass(frozen=True)
class FailStopReport:
    """What a node says about itself when it stops on a fatal condition."""

    peer_id: str
    session_id: str
    provider_id: str
    hostname: str
    reason: str
    exit_code: int
    engine: str
    engine_log_path: str
    engine_log: list[str]
    node_log: list[str]
    time: float = dataclasses.field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        """The JSON body an HTTP sink receives."""
        return {"event": "otela.fail_stop", **dataclasses.asdict(self)}

    def to_text(self) -> str:
        """The block a file sink appends: a header naming node, session and reason, then both tails."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time))
        lines = [
            f"===== otela fail-stop {stamp} node={self.peer_id} session={self.session_id} "
            f"provider={self.provider_id} host={self.hostname} exit={self.exit_code} =====",
            f"reason: {self.reason}",
            f"----- engine {self.engine or 'none'} log: last {len(self.engine_log)} lines of "
            f"{self.engine_log_path or '(no engine)'} -----",
            *self.engine_log,
            f"----- node log: last {len(self.node_log)} records -----",
            *self.node_log,
            f"===== end of fail-stop report of session {self.session_id} =====",
        ]
        return "\n".join(lines) + "\n"


def _in_daemon_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run blocking `fn` in a daemon thread: a write stuck on a dead network filesystem cannot hold up exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="otela-log-sink", daemon=True).start()
    return future


class LogSink:
    """A file path (reports are appended) or an http(s) URL (reports are POSTed as JSON)."""

    def __init__(self, target: str, *, timeout: float = 10.0) -> None:
        target = target.strip()
        if not target:
            raise ConfigError("a log sink needs a file path or an http(s):// URL")
        self.timeout = timeout
        self.url: str | None = None
        self.path: Path | None = None
        if target.startswith(("http://", "https://")):
            self.url = target
        elif target.startswith("file://"):
            self.path = Path(target.removeprefix("file://")).expanduser()
        elif "://" in target:
            raise ConfigError(f"log sink {target!r}: use a file path, file://PATH, http:// or https:// URL")
        else:
            self.path = Path(target).expanduser()

    def __repr__(self) -> str:
        return f"<LogSink {self.url or self.path}>"

    async def ship(self, report: FailStopReport) -> bool:
        """Deliver `report` within the timeout; False (and a warning) when it could not be delivered."""
        try:
            async with asyncio.timeout(self.timeout):
                if self.url is not None:
                    await self._post(report)
                else:
                    await _in_daemon_thread(lambda: self._append(report))
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.warning("could not ship the fail-stop report to %s: %s", self, exc or type(exc).__name__)
            return False
        logger.info("fail-stop report shipped", extra={"sink": str(self.url or self.path)})
        return True

    def _append(self, report: FailStopReport) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(report.to_text())

    async def _post(self, report: FailStopReport) -> None:
        assert self.url is not None
        body = json.dumps(report.to_json()).encode()
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.url, data=body, headers={"Content-Type": "application/json"}) as resp,
        ):
            await resp.read()
            if resp.status >= 300:
                raise ValueError(f"the sink answered HTTP {resp.status}")
