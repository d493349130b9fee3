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
where the async driver would hop once per statement. That connection never checkpoints the write-ahead log itself:
SQLite's automatic checkpoint runs inside the commit that crosses its threshold (about every 250 requests here) and
stalled that commit, and every request waiting on it, by 4-5 ms. A second thread runs a passive checkpoint instead,
after WAL_CHECKPOINT_COMMITS commits or a second with any, alongside the writer, which it does not block.

On PostgreSQL the transaction runs on the async engine, and a completion is one call of the `otela_complete`
function (frontend/pg_calls.py): a batch of one completion, the common case when requests come one at a time, is one
round trip instead of five.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Container
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from asyncpg import Record
from sqlalchemy import (
    CursorResult,
    Engine,
    bindparam,
    create_engine,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from opentela.frontend.counters import ADD_RATE_TOKENS, RateKey, counter_upsert, rate_slot, rate_upsert
from opentela.frontend.db import Database, sqlite_pragmas
from opentela.frontend.pg_calls import COMPLETE_CALL, Call, PostgresCalls, prefixed
from opentela.frontend.schema import ApiKey, UsageRow

logger = logging.getLogger(__name__)

T = TypeVar("T")
WAL_CHECKPOINT_COMMITS = 64
"""On SQLite, commits after which the background thread checkpoints the write-ahead log (see the module's docstring)."""
WAL_CHECKPOINT_EVERY_S = 1.0
"""... or seconds, when fewer commits came in that time."""
WAL_RESTART_FRAMES = 2048
"""Pages in the log past which a checkpoint also restarts it. The log starts over at the first commit that finds it
wholly copied; a commit that comes in while the passive checkpoint runs (under sustained load, nearly all) finds new
pages and appends, so the log would grow without bound. A restarting checkpoint briefly holds commits back while it
copies the pages the passive one left (few) and waits for readers, once per this many pages (8 MiB)."""
CounterKey = tuple[str, str, float]
"""(key id, budget period, period start) of one budget counter."""


INSERT, CHECKPOINT, COMPLETE = "insert", "checkpoint", "complete"


@dataclass(slots=True)
class RowChange:
    """One change to a usage row and the budget counter delta it carries.

    `insert` writes a new row (`values`: every column); `checkpoint` updates a stream's progress (`output_tokens`,
    `provider`, `node`) only while the row is still pending, and its counter delta likewise; `complete` writes the
    final columns (COMPLETION_COLUMNS).
    """

    row_id: str
    values: dict[str, Any]
    kind: str = INSERT
    counter: CounterKey | None = None
    delta: tuple[int, int] = (0, 0)
    """(requests, tokens) to add to `counter` and to the rate bucket `rate` when the change applies."""
    rate: RateKey | None = None
    """(key id, second) of the rate bucket the request is counted in."""
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Resolves once committed: True when the change applied (a checkpoint may find the row already done)."""


COMPLETION_COLUMNS = (
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
CHECKPOINT_COLUMNS = ("output_tokens", "provider", "node")

# Built once: executing a prepared statement hits SQLAlchemy's compiled cache, where building one per batch cost
# more than the SQLite transaction itself. Bound names carry a prefix (SQLAlchemy reserves the column names).
_COMPLETE = (
    update(UsageRow)
    .where(UsageRow.id == bindparam("b_row_id"))
    .values({name: bindparam("b_" + name) for name in COMPLETION_COLUMNS})
)
_CHECKPOINT = (
    update(UsageRow)
    .where(UsageRow.id == bindparam("b_row_id"), UsageRow.status == "pending")
    .values({name: bindparam("b_" + name) for name in CHECKPOINT_COLUMNS})
)
TOUCH_KEY = update(ApiKey).where(ApiKey.id == bindparam("b_key_id")).values(last_used_at=bindparam("b_when"))
UPSERT_RATE = {dialect: rate_upsert(dialect) for dialect in ("sqlite", "postgresql")}
UPSERT_COUNTER = {
    dialect: counter_upsert(
        dialect,
        bindparam("b_key_id"),
        bindparam("b_period"),
        bindparam("b_start"),
        bindparam("b_requests"),
        bindparam("b_tokens"),
    )
    for dialect in ("sqlite", "postgresql")
}


def _bound(row_id: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"b_row_id": row_id, **{"b_" + k: v for k, v in values.items()}}


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
        self._wal_thread: ThreadPoolExecutor | None = None
        self._wal_checkpoint: asyncio.Future[None] | None = None
        self._wal_checkpointed = (0, 0.0)
        """(commits, monotonic time) at the last WAL checkpoint."""
        self._postgres: PostgresCalls | None = None
        self.commits = 0
        """Transactions committed (each may hold the changes of many requests)."""
        self.changes = 0
        """Row changes committed."""
        url = db.engine.url
        if db.dialect == "sqlite" and url.database not in (None, "", ":memory:"):
            self._sync_engine = create_engine(url.set(drivername="sqlite"))
            event.listen(self._sync_engine, "connect", sqlite_pragmas)
            event.listen(self._sync_engine, "connect", _no_autocheckpoint)
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="usage-writer")
            self._wal_thread = ThreadPoolExecutor(1, thread_name_prefix="wal-checkpoint")
        elif db.dialect == "postgresql":
            self._postgres = db.postgres

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
        if self._wal_checkpoint is not None:
            await asyncio.gather(self._wal_checkpoint, return_exceptions=True)
        if self._wal_thread is not None:
            self._wal_thread.shutdown(wait=True)
            self._wal_thread = None
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
                if self._postgres is not None and not touches and all(c.kind == COMPLETE for c in batch):
                    applied = await self._complete_pg(batch)
                else:
                    applied = await self._run(_apply_batch, batch, touches)
            except Exception as exc:
                if len(batch) <= 1:
                    self._fail(batch, exc)
                    continue
                logger.warning(
                    "a batch of %d usage changes failed (%s); retrying one by one", len(batch), exc
                )
                for change in batch:
                    if self._lost and not self._drop_lost([change]):
                        continue  # its row's insert just failed
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
        self._maybe_checkpoint_wal()

    def _maybe_checkpoint_wal(self) -> None:
        if self._wal_thread is None or self._sync_engine is None:
            return
        if self._wal_checkpoint is not None and not self._wal_checkpoint.done():
            return
        commits, at = self._wal_checkpointed
        now = time.monotonic()
        since = self.commits - commits
        if since >= WAL_CHECKPOINT_COMMITS or (since and now - at >= WAL_CHECKPOINT_EVERY_S):
            self._wal_checkpointed = (self.commits, now)
            loop = asyncio.get_running_loop()
            self._wal_checkpoint = loop.run_in_executor(self._wal_thread, _checkpoint_wal, self._sync_engine)

    def _drop_lost(self, batch: list[RowChange]) -> list[RowChange]:
        kept = []
        for change in batch:
            why = self._lost.get(change.row_id)
            if why is None or change.kind == INSERT:
                kept.append(change)
                continue
            if change.kind == COMPLETE:  # the row's last change: nothing more will come for it
                del self._lost[change.row_id]
            change.future.set_exception(why)
            change.future.exception()
        return kept

    def _fail(self, batch: list[RowChange], exc: BaseException) -> None:
        logger.error("could not write %d usage changes: %s", len(batch), exc)
        for change in batch:
            if change.kind == INSERT:
                self._lost[change.row_id] = exc
            if not change.future.done():
                change.future.set_exception(exc)
                # Marked as seen: a caller that only enqueued learns of the failure through its own follow-up.
                change.future.exception()

    async def call(self, call: Call, params: dict[str, Any]) -> Record:
        """Run one function call in a transaction of its own, one round trip (PostgreSQL); its row."""
        assert self._postgres is not None, "only PostgreSQL runs single calls"
        return await self._postgres.one(call, params)

    async def _complete_pg(self, batch: list[RowChange]) -> list[bool]:
        # In key order, the lock order of every writer (migration 0003); results go back in the batch's order.
        calls = sorted(
            ((i, _completion_call(change)) for i, change in enumerate(batch)), key=lambda c: c[1]["p_key"]
        )
        assert self._postgres is not None
        if len(calls) == 1:
            return [bool((await self.call(COMPLETE_CALL, calls[0][1]))[0])]
        applied = [False] * len(calls)
        results = await self._postgres.each(COMPLETE_CALL, [call for _, call in calls])
        for (i, _), result in zip(calls, results, strict=True):
            applied[i] = bool(result)
        return applied

    async def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(connection, *args)` in one transaction of its own on the writer's connection, committed unless
        `fn` raises (one thread hop on SQLite)."""
        return await self._run(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(connection, *args)` in one committed transaction."""
        if self._sync_engine is not None and self._thread is not None:
            engine = self._sync_engine

            def in_thread() -> T:
                with engine.begin() as conn:
                    return fn(conn, *args)

            return await asyncio.get_running_loop().run_in_executor(self._thread, in_thread)
        async with self.db.engine.begin() as conn:
            return cast(T, await conn.run_sync(fn, *args))


def _no_autocheckpoint(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")


def _checkpoint_wal(engine: Engine) -> None:
    """Copy what the write-ahead log holds into the database file, without waiting for readers or writers; when
    the log has grown past WAL_RESTART_FRAMES all the same, make the next commit start it over (see there)."""
    try:
        with engine.connect() as conn:
            _busy, frames, _done = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
            if frames > WAL_RESTART_FRAMES:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)")
    except Exception as exc:  # the next one retries; until then the log only grows
        logger.warning("WAL checkpoint failed: %s", exc)


def _completion_call(change: RowChange) -> dict[str, Any]:
    """The parameters of `otela_complete` for a completion."""
    assert change.rate is not None, "a completion names its rate bucket"
    key_id, second = change.rate
    period, start = (None, None) if change.counter is None else change.counter[1:]
    return prefixed(
        {
            "id": change.row_id,
            **{name: change.values[name] for name in COMPLETION_COLUMNS},
            "key": key_id,
            "period": period,
            "start": start,
            "second": second,
            "slot": rate_slot(second),
            "delta": change.delta[1],
        }
    )


def _resolve(batch: list[RowChange], applied: list[bool]) -> None:
    for change, ok in zip(batch, applied, strict=True):
        if not change.future.done():
            change.future.set_result(ok)


def _apply_batch(conn: Connection, batch: list[RowChange], touches: dict[str, float]) -> list[bool]:
    """Apply a batch in the connection's transaction; whether each change applied, in order."""
    inserts: dict[str, dict[str, Any]] = {}
    completions: list[tuple[int, RowChange]] = []
    checkpoints: list[tuple[int, RowChange]] = []
    applied = [True] * len(batch)
    deltas: dict[CounterKey, list[int]] = {}
    new_rates: dict[RateKey, list[int]] = {}
    """Buckets of the requests inserted by this batch, with the changes folded into them."""
    rates: dict[RateKey, list[int]] = {}
    """Token corrections to buckets of requests inserted earlier."""
    for i, change in enumerate(batch):
        pending = inserts.get(change.row_id)
        if change.kind == INSERT:
            inserts[change.row_id] = dict(change.values)
        elif pending is not None:
            # The row is inserted by this very batch: fold the change into the insert.
            if change.kind == CHECKPOINT and pending["status"] != "pending":
                applied[i] = False
                continue
            pending.update(change.values)
        elif change.kind == COMPLETE:
            completions.append((i, change))
            continue
        else:
            checkpoints.append((i, change))
            continue
        _add(deltas, change)
        _add_rate(new_rates, change)
    for key_id, when in sorted(touches.items()):
        conn.execute(TOUCH_KEY, {"b_key_id": key_id, "b_when": when})
    if inserts:
        # executemany wants one set of columns: rows completed in this batch have more than pending ones.
        shapes: dict[frozenset[str], list[dict[str, Any]]] = {}
        for row in inserts.values():
            shapes.setdefault(frozenset(row), []).append(row)
        for rows in shapes.values():
            conn.execute(insert(UsageRow), rows)
    if completions:
        params = [_bound(c.row_id, c.values) for _, c in completions]
        # One row alone runs as a plain statement, whose count every driver reports (saving the check below).
        result = cast(CursorResult[Any], conn.execute(_COMPLETE, params[0] if len(params) == 1 else params))
        present: Container[str]
        if result.rowcount == len(completions):
            present = {c.row_id for _, c in completions}
        else:
            # Some row is missing, or the driver does not count an executemany (asyncpg): ask which rows exist,
            # and count none of the tokens of a row that is not there.
            ids = [c.row_id for _, c in completions]
            present = set(conn.execute(select(UsageRow.id).where(UsageRow.id.in_(ids))).scalars())
        for i, change in completions:
            if change.row_id in present:
                _add(deltas, change)
                _add_rate(rates, change)
            else:
                applied[i] = False
    for i, change in checkpoints:
        result = cast(CursorResult[Any], conn.execute(_CHECKPOINT, _bound(change.row_id, change.values)))
        if not result.rowcount:
            applied[i] = False
            continue
        _add(deltas, change)
        _add_rate(rates, change)
    # Counters, then rate buckets, key by key in key order: the lock order every writer keeps (migration 0003).
    writes: dict[str, list[tuple[Any, dict[str, Any]]]] = defaultdict(list)
    upsert_counter, upsert_rate = UPSERT_COUNTER[conn.dialect.name], UPSERT_RATE[conn.dialect.name]
    for (key_id, period, start), (requests, tokens) in sorted(deltas.items()):
        if requests or tokens:
            counter = {"b_key_id": key_id, "b_period": period, "b_start": start}
            writes[key_id].append((upsert_counter, {**counter, "b_requests": requests, "b_tokens": tokens}))
    for (key_id, second), (requests, tokens) in sorted(new_rates.items()):
        bucket = {"b_key_id": key_id, "b_slot": rate_slot(second), "b_second": second}
        writes[key_id].append((upsert_rate, {**bucket, "b_requests": requests, "b_tokens": tokens}))
    for (key_id, second), (_, tokens) in sorted(rates.items()):
        if tokens:
            bucket = {"b_key_id": key_id, "b_slot": rate_slot(second), "b_second": second}
            writes[key_id].append((ADD_RATE_TOKENS, {**bucket, "b_tokens": tokens}))
    for key_id in sorted(writes):
        for statement, bound in writes[key_id]:
            conn.execute(statement, bound)
    return applied


def _add(deltas: dict[CounterKey, list[int]], change: RowChange) -> None:
    if change.counter is not None:
        total = deltas.setdefault(change.counter, [0, 0])
        total[0] += change.delta[0]
        total[1] += change.delta[1]


def _add_rate(rates: dict[RateKey, list[int]], change: RowChange) -> None:
    if change.rate is not None:
        total = rates.setdefault(change.rate, [0, 0])
        total[0] += change.delta[0]
        total[1] += change.delta[1]
