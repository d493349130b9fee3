"""A set of background tasks owned by one long-lived component, with one stated error policy.

Error policy: cancellation is silent; a task that ends with an exception has it retrieved at once (never the
"exception was never retrieved" warning) and handed to the owner's `on_error`, which by default logs it at ERROR with
the task's name. `aclose()` cancels what is left and waits, bounded by a timeout, so a stuck task cannot hold a
shutdown forever. A TaskGroup would cancel every sibling on the first failure, which is wrong for a node whose
gossip loop must outlive a failed dial.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

logger = logging.getLogger(__name__)

ErrorHandler = Callable[[asyncio.Task[Any], BaseException], None]


def log_task_error(task: asyncio.Task[Any], exc: BaseException) -> None:
    """The default policy: log the failure with the task's name."""
    logger.error("task %s failed", task.get_name(), exc_info=exc)


class TaskSet:
    """Background tasks of one owner: spawn, forget when done, cancel and wait on close."""

    def __init__(self, owner: str, on_error: ErrorHandler = log_task_error) -> None:
        self.owner = owner
        self._on_error = on_error
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<TaskSet {self.owner} running={len(self._tasks)}>"

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start `coro` as a task named `otela-<name>` that this set owns."""
        task = asyncio.get_running_loop().create_task(coro, name=f"otela-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._on_error(task, exc)

    async def aclose(self, timeout: float | None = 5.0) -> None:
        """Cancel every task still running and wait for them (at most `timeout` seconds)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
