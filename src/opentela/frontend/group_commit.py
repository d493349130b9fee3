"""Group commit of usage writes: the row and counter changes of concurrent requests share one transaction.

Each request writes its usage row twice (pending at admission, completed at the end) and checkpoints long streams in
between. Committing each of those alone made the database the frontend's largest cost. Here every change is queued
and a single flusher applies everything queued so far in one transaction: while one commit is under way, the changes
that arrive queue up for the next. A caller that needs durability awaits the future of its change, which resolves once
the transaction holding it committed; a caller that does not (the pending row, whose durability is awaited later,
before the first byte reaches the client) only enqueues.

Within a batch, changes to a row that is inserted in the same batch are folded into the insert, so a short request
costs one row insert; the budget counter deltas of the batch are summed per counter, one upsert each. A failing batch
is retried change by change, so one bad change cannot fail the others.

On SQLite the transaction runs in one dedicated thread on a plain (synchronous) connection: one thread hop per batch,
where the async driver would hop once per statement. On PostgreSQL it runs on the async engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, bindparam, create_engine, event, insert, update
from sqlalchemy.engine import Connection

from opentela.frontend.counters import counter_upsert
from opentela.frontend.db import Database, sqlite_pragmas
from opentela.frontend.schema import ApiKey, UsageRow

logger = logging.getLogger(__name__)

CounterKey = tuple[str, str, float]
"""(key id, budget period, period start) of one budget counter."""


@dataclass(slots=True)
class RowChange:
    """One change to a usage row and the budget counter delta it carries."""

    row_id: str
    values: dict[str, Any]
    insert: bool = False
    only_pending: bool = False
    """An update that applies only while the row is still pending (checkpoints); its counter delta likewise."""
    counter: CounterKey | None = None
    delta: tuple[int, int] = (0, 0)
    """(requests, tokens) to add to `counter` when the change applies."""
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Resolves once committed: True when the change applied (an only-pending update may find the row done)."""


_COMPLETION_COLUMNS = (
    "status",
    "http_status",
    "provider",
    "node",
    "input_tokens",
    "output_tokens",
    "tokens_estimated",
    "finished_at",
    "latency_ms",
    "ttft_ms",
    "error",
)


class UsageWriter:
    """Queues usage row changes and commits them in shared transactions (see the module's docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._queue: list[RowChange] = []
        self._touches: dict[str, float] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._lost: dict[str, BaseException] = {}
        """Rows whose insert failed, and why: their later changes fail the same way instead of applying."""
        self._sync_engine: Engine | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.commits = 0
        """Transactions committed (each may hold the changes of many requests)."""
        self.changes = 0
        """Row changes committed."""
        url = db.engine.url
        if db.dialect == "sqlite" and url.database not in (None, "", ":memory:"):
            self._sync_engine = create_engine(url.set(drivername="sqlite"))
            event.listen(self._sync_engine, "connect", sqlite_pragmas)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="usage-writer")

    def __repr__(self) -> str:
        return f"<UsageWriter queued={len(self._queue)} commits={self.commits} changes={self.changes}>"

    def submit(self, change: RowChange) -> asyncio.Future[bool]:
        """Queue `change` for the next commit; its future resolves when that commit is done."""
        self._queue.append(change)
        self._kick()
        return change.future

    def touch(self, key_id: str, when: float) -> None:
        """Record that a key was used at `when`, with the next commit (not awaited; coalesced per key)."""
        self._touches[key_id] = max(when, self._touches.get(key_id, 0.0))
        self._kick()

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (or failed)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def aclose(self) -> None:
        """Flush, then release the writer's own connection and thread."""
        await self.flush()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self._sync_engine is not None:
            self._sync_engine.dispose()
            self._sync_engine = None

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_all(), name="usage-writer")

    async def _flush_all(self) -> None:
        # Let the requests that are ready in this loop iteration join the first batch.
        await asyncio.sleep(0)
        while self._queue or self._touches:
            batch, touches = self._queue, self._touches
            self._queue, self._touches = [], {}
            if self._lost:
                batch = self._drop_lost(batch)
            try:
                applied = await self._run(_apply_batch, batch, touches)
            except Exception as exc:
                if len(batch) <= 1:
                    self._fail(batch, exc)
                    continue
                logger.warning(
                    "a batch of %d usage changes failed (%s); retrying one by one", len(batch), exc
                )
                for change in batch:
                    try:
                        (ok,) = await self._run(_apply_batch, [change], {})
                    except Exception as one:
                        self._fail([change], one)
                    else:
                        _resolve([change], [ok])
                        self.commits += 1
                        self.changes += 1
                continue
            self.commits += 1
            self.changes += len(batch)
            _resolve(batch, applied)

    def _drop_lost(self, batch: list[RowChange]) -> list[RowChange]:
        kept = []
        for change in batch:
            why = self._lost.get(change.row_id)
            if why is None or change.insert:
                kept.append(change)
                continue
            if not change.only_pending:  # the row's last change: nothing more will come for it
                del self._lost[change.row_id]
            change.future.set_exception(why)
            change.future.exception()
        return kept

    def _fail(self, batch: list[RowChange], exc: BaseException) -> None:
        logger.error("could not write %d usage changes: %s", len(batch), exc)
        for change in batch:
            if change.insert:
                self._lost[change.row_id] = exc
            if not change.future.done():
                change.future.set_exception(exc)
                # Marked as seen: a caller that only enqueued learns of the failure through its own follow-up.
                change.future.exception()

    async def _run(self, fn: Callable[..., list[bool]], *args: Any) -> list[bool]:
        """Run `fn(connection, *args)` in one committed transaction."""
        if self._sync_engine is not None and self._thread is not None:
            engine = self._sync_engine

            def in_thread() -> list[bool]:
                with engine.begin() as conn:
                    return fn(conn, *args)

            return await asyncio.get_running_loop().run_in_executor(self._thread, in_thread)
        async with self.db.engine.begin() as conn:
            return cast(list[bool], await conn.run_sync(fn, *args))


def _resolve(batch: list[RowChange], applied: list[bool]) -> None:
    for change, ok in zip(batch, applied, strict=True):
        if not change.future.done():
            change.future.set_result(ok)


def _apply_batch(conn: Connection, batch: list[RowChange], touches: dict[str, float]) -> list[bool]:
    """Apply a batch in the connection's transaction; whether each change applied, in order."""
    inserts: dict[str, dict[str, Any]] = {}
    updates: list[tuple[int, RowChange]] = []
    applied = [True] * len(batch)
    deltas: dict[CounterKey, list[int]] = {}
    for i, change in enumerate(batch):
        pending = inserts.get(change.row_id)
        if change.insert:
            inserts[change.row_id] = dict(change.values)
        elif pending is not None:
            # The row is inserted by this very batch: fold the change into the insert.
            if change.only_pending and pending.get("status") != "pending":
                applied[i] = False
                continue
            pending.update(change.values)
        else:
            updates.append((i, change))
            continue
        _add(deltas, change)
    if inserts:
        conn.execute(insert(UsageRow), list(inserts.values()))
    completions = [c for _, c in updates if not c.only_pending and set(c.values) == set(_COMPLETION_COLUMNS)]
    if completions:
        statement = (
            update(UsageRow)
            .where(UsageRow.id == bindparam("row_id"))
            .values({name: bindparam(name) for name in _COMPLETION_COLUMNS})
        )
        conn.execute(statement, [{"row_id": c.row_id, **c.values} for c in completions])
        for change in completions:
            _add(deltas, change)
    grouped = {id(c) for c in completions}
    for i, change in updates:
        if id(change) in grouped:
            continue
        statement = update(UsageRow).where(UsageRow.id == change.row_id)
        if change.only_pending:
            statement = statement.where(UsageRow.status == "pending")
        result = cast(CursorResult[Any], conn.execute(statement.values(change.values)))
        if change.only_pending and not result.rowcount:
            applied[i] = False
            continue
        _add(deltas, change)
    for (key_id, period, start), (requests, tokens) in deltas.items():
        if requests or tokens:
            conn.execute(counter_upsert(conn.dialect.name, key_id, period, start, requests, tokens))
    for key_id, when in touches.items():
        conn.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=when))
    return applied


def _add(deltas: dict[CounterKey, list[int]], change: RowChange) -> None:
    if change.counter is not None:
        total = deltas.setdefault(change.counter, [0, 0])
        total[0] += change.delta[0]
        total[1] += change.delta[1]
