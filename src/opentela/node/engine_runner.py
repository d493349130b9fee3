"""Running one engine on a node: start it, wait until it serves, watch its health and log, give the verdict.

A node may run several engines, each its own replica: it holds one EngineRunner per engine, keyed by
`EngineRunner.key`. The runner decides nothing about the node; it reports through its callbacks:
`on_serving` once the engine answers with its models, `on_models` when what the engine advertises for them
changes afterwards (a tensor-parallel replica reconfiguring), `on_fatal(reason, exit_code)` when the engine is
lost (the node fail-stops), and, for an assigned engine, `on_not_served(runner, reason)` when it never served (the
node goes back to idle instead of exiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from opentela._tasks import ErrorHandler, TaskSet, log_task_error
from opentela.engines.base import EngineSpec, advertised_settings
from opentela.errors import EngineCrashedError, UpstreamTimeout
from opentela.node._config import NodeConfig
from opentela.node.engine_health import check_http, watch_health
from opentela.node.engine_settings import engine_settings
from opentela.node.logwatch import FatalLogWatch
from opentela.node.supervisor import EngineSupervisor
from opentela.registry.record import ModelEntry

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ENGINE_DIED = 3
EXIT_ENGINE_NOT_READY = 4
EXIT_ENGINE_UNHEALTHY = 5
EXIT_FATAL_LOG_LINE = 6

OnServing = Callable[["EngineRunner", tuple[ModelEntry, ...]], None]
OnFatal = Callable[[str, int], Awaitable[None]]
OnNotServed = Callable[["EngineRunner", str], Awaitable[None]]


def served_models(
    spec: EngineSpec, served: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> tuple[ModelEntry, ...]:
    """The record's model entries for what the engine's /v1/models listed (`extra` joins their settings)."""
    return tuple(
        ModelEntry(id=str(m["id"]), engine=spec.name, settings={**advertised_settings(m), **(extra or {})})
        for m in served
        if m.get("id")
    )


def refreshed_models(
    models: tuple[ModelEntry, ...], listing: Any, extra: dict[str, Any] | None = None
) -> tuple[ModelEntry, ...]:
    """`models` with the settings a later /v1/models answer (`listing`, parsed JSON) gives them.

    Only settings change: the models served are the ones the engine listed when it became ready, and one missing
    from the answer (or an answer that is no model list, from a custom health path) keeps what it had.
    """
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return models
    listed = {str(m["id"]): m for m in data if isinstance(m, dict) and m.get("id")}
    return tuple(
        ModelEntry(m.id, m.engine, {**advertised_settings(listed[m.id]), **(extra or {})})
        if m.id in listed
        else m
        for m in models
    )


class EngineRunner:
    """One engine of this node, from start to its last verdict.

    `stop` is the node's stop event: an engine that exits while the node stops (a batch system signals both)
    is no failure. `retire()` silences the runner once the node fail-stops for any reason.
    """

    def __init__(
        self,
        spec: EngineSpec,
        log_path: Path,
        config: NodeConfig,
        *,
        stop: asyncio.Event,
        on_serving: OnServing,
        on_fatal: OnFatal,
        on_not_served: OnNotServed | None = None,
        on_task_error: ErrorHandler = log_task_error,
        on_lost: OnNotServed | None = None,
        on_models: OnServing | None = None,
    ) -> None:
        self.spec = spec
        self.log_path = log_path
        self.config = config
        self._stop = stop
        self._on_serving, self._on_fatal, self._on_not_served = on_serving, on_fatal, on_not_served
        self._on_lost = on_lost
        self._on_models = on_models
        self.supervisor = EngineSupervisor(spec, log_path, ready_timeout=config.ready_timeout)
        self.ready = False
        self.retired = False
        self.models: tuple[ModelEntry, ...] = ()
        self.assigned_model = ""
        """The model a controller started it for ("" when the node was started with it)."""
        self.memory_mib: int | None = None
        """Its share of the node's engine memory; None: it runs on the node alone."""
        self.profile = ""
        """The id of the performance profile it runs under, if any."""
        self.keep_alive_s: float | None = None
        """Stopped by the node once it served nothing for this long (serverless); None: kept."""
        self.ready_at = 0.0
        """When it started serving (monotonic clock)."""
        self._extra: dict[str, Any] = {}
        self._last_listing = b""
        self._watchers = TaskSet(f"engine-{spec.name}", on_error=on_task_error)

    def __repr__(self) -> str:
        state = "ready" if self.ready else ("retired" if self.retired else "not ready")
        return f"<EngineRunner {self.key} {state} {self.supervisor!r}>"

    @property
    def key(self) -> str:
        """How the node tells its engines apart: name and port."""
        return f"{self.spec.name}:{self.spec.port}"

    @property
    def model_ids(self) -> set[str]:
        """The models it serves, or was started for while it loads."""
        return {m.id for m in self.models} | ({self.assigned_model} if self.assigned_model else set())

    @property
    def assigned(self) -> bool:
        """Whether a controller assigned this engine (it then sends the node back to idle when it fails)."""
        return self._on_not_served is not None

    def retire(self) -> None:
        """The node is going down: refuse requests at once and report nothing more."""
        self.ready, self.retired = False, True

    def log_tail(self, n_lines: int) -> list[str]:
        """The engine's last `n_lines` log lines (none for n_lines = 0)."""
        return self.supervisor.log_tail(n_lines).splitlines() if n_lines > 0 else []

    async def run(self) -> None:
        """Start the engine, announce it when it serves, and give the verdict when it fails or exits."""
        try:
            await self.supervisor.start()
        except EngineCrashedError as exc:
            await self._not_served(f"engine could not start: {exc.message}")
            return
        logger.info("engine started", extra={"pid": self.supervisor.pid, "log": str(self.log_path)})
        log_watch = FatalLogWatch(
            self.log_path, self.config.fatal_log_patterns, offset=self.supervisor.output_offset
        )
        if log_watch.patterns:
            # Watched from the start: an NCCL timeout while loading should not wait out the ready timeout.
            self._watchers.spawn(self._watch_log(log_watch), "log-watch")
        try:
            served = await self.supervisor.wait_ready()
        except (EngineCrashedError, UpstreamTimeout) as exc:
            logger.error("engine never became ready: %s", exc)
            await self._not_served(f"engine not ready: {exc.message}")
            return
        # What the engine runs with (quantization, dtype, parallelism, window...), then the node's own notes.
        extra: dict[str, Any] = await engine_settings(self.spec, served)
        if self.retired:
            return  # stopped while its settings were read: it never serves
        if self.memory_mib is not None:
            extra["memory_mib"] = self.memory_mib
        if self.profile:
            extra["profile"] = self.profile
        self._extra = extra
        self.models = served_models(self.spec, served, extra)
        self.ready, self.ready_at = True, time.monotonic()
        self._on_serving(self, self.models)
        if self.config.health_interval > 0 or self.config.state_interval > 0:
            self._watchers.spawn(self._watch_health(), "health")
        code = await self.supervisor.wait_exit()
        self.ready = False
        # A batch system signals the node and its engine together: let the node's own stop arrive first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), 0.5)
        if self._stop.is_set() or self.retired:
            return
        reason = f"engine exited with code {code}"
        fatal = log_watch.scan(final=True)
        if fatal is not None:
            reason += f" after a fatal log line: {fatal}"
        logger.error("%s; marking this node DOWN", reason, extra={"log": str(self.log_path)})
        await self._lost(reason, EXIT_ENGINE_DIED)

    async def _lost(self, reason: str, code: int) -> None:
        """A serving engine failed: one that shares the node (it has a memory footprint) is dropped alone and the
        node goes on with its others; the node's only engine takes the node down with it (fail-stop)."""
        if self.memory_mib is not None and self._on_lost is not None:
            logger.error(
                "engine of %s lost; the node's other engines go on: %s", sorted(self.model_ids), reason
            )
            self.retire()
            # The node stops it (from its own tasks: this may run in one of the watchers aclose() cancels).
            await self._on_lost(self, reason)
            return
        await self._on_fatal(reason, code)

    async def _not_served(self, reason: str) -> None:
        if self._on_not_served is None:
            await self._on_fatal(reason, EXIT_ENGINE_NOT_READY)
            return
        logger.error("assigned engine failed; the node is idle again: %s", reason)
        await self.aclose()
        await self._on_not_served(self, reason)

    async def _watch_log(self, watch: FatalLogWatch) -> None:
        line = await watch.watch()
        logger.error("fatal line in the engine log: %s", line, extra={"log": str(watch.path)})
        await self._lost(f"fatal engine log line: {line}", EXIT_FATAL_LOG_LINE)

    async def _watch_health(self) -> None:
        """Check the engine's health path, and read what its answer advertises (health checks off: only that)."""
        cfg = self.config
        url = self.spec.base_url + self.spec.health_path
        checking = cfg.health_interval > 0

        async def check() -> bool:
            body = await check_http(http, url, cfg.health_timeout)
            if body is not None:
                self.refresh(body)
            return body is not None or not checking

        async with aiohttp.ClientSession() as http:
            reason = await watch_health(
                check,
                interval=cfg.health_interval if checking else cfg.state_interval,
                failures=cfg.health_failures if checking else 0,
                unhealthy_limit=cfg.unhealthy_limit if checking else 0.0,
                every=cfg.state_interval,
            )
        logger.error("%s: fail-stop", reason, extra={"url": url})
        await self._lost(reason, EXIT_ENGINE_UNHEALTHY)

    def refresh(self, body: bytes) -> None:
        """Take the settings a health answer (a /v1/models body) advertises; tell the node when they changed."""
        if body == self._last_listing:
            return  # unchanged bytes: nothing to parse (an engine stamping `created` per answer is parsed)
        self._last_listing = body
        try:
            listing = json.loads(body)
        except ValueError:
            return  # a health path that is not JSON says nothing about the models
        models = refreshed_models(self.models, listing, self._extra)
        if models == self.models or not self.ready:
            return
        self.models = models
        logger.info(
            "engine advertises new settings",
            extra={"models": ",".join(m.id for m in models), "state": _states(models)},
        )
        if self._on_models is not None:
            self._on_models(self, models)

    async def aclose(self) -> None:
        """Stop watching and stop the engine (SIGTERM, then SIGKILL after the node's `stop_timeout`)."""
        self.ready = False
        await self._watchers.aclose()
        await self.supervisor.stop(timeout=self.config.stop_timeout)


def _states(models: tuple[ModelEntry, ...]) -> str:
    return ",".join(sorted({m.replica_state for m in models}))
