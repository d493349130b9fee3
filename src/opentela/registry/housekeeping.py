"""Registry upkeep on a timer: garbage collection of dead records and re-signing of our own live record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from opentela._types import Lifecycle
from opentela.registry._config import RegistryConfig
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)


class Housekeeping:
    """Runs `collect_garbage` every `gc_interval` and keeps our record fresher than `refresh_interval`.

    A replica refuses records older than `tombstone_retention`, so a live node re-signs its unchanged record now
    and then. A node whose own record got that old (it was paused or cut off for longer) is gone from every other
    replica: `on_expired` is called so it can rejoin under a new session.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        config: RegistryConfig | None = None,
        on_expired: Callable[[], None] | None = None,
    ) -> None:
        self.registry = registry
        self.config = config or RegistryConfig()
        self.on_expired = on_expired
        self._task: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        return f"<Housekeeping every {self.config.gc_interval:g} s>"

    async def start(self) -> None:
        """Start the timer."""
        self._task = asyncio.create_task(self._loop(), name="otela-registry-housekeeping")

    async def aclose(self) -> None:
        """Stop the timer."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.config.gc_interval, self.config.refresh_interval))
            self.run_once()

    def run_once(self) -> dict[str, int]:
        """One pass: refresh or give up our record, then collect garbage."""
        local = self.registry.local
        age = self.registry.clock() - local.updated_at
        if local.lifecycle <= Lifecycle.SERVING:
            if age > self.config.tombstone_retention and self.on_expired is not None:
                logger.warning("our record is older than any replica keeps: rejoining under a new session")
                self.on_expired()
            elif age >= self.config.refresh_interval:
                self.registry.update_local()
        result = self.registry.collect_garbage()
        if result["compacted"]:
            logger.info("compacted dead records", extra=result)
        return result
