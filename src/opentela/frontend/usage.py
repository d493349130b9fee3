"""The usage ledger: admission (limits checked and a pending row written in one transaction), completion,
crash reconciliation, aggregates and the anonymized trace export."""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, case, func, or_, select, update

from opentela.bench.traces import CSV_COLUMNS, TraceRecord, csv_row, sampling_values
from opentela.frontend.admission_db import Refused, admit_call, admit_transaction
from opentela.frontend.counters import (
    RateKey,
    has_budget,
    rate_second,
    rebuild_counters_sync,
    rebuild_rate_sync,
    window_consumption,
)
from opentela.frontend.db import Database
from opentela.frontend.group_commit import (
    CHECKPOINT,
    COMPLETE,
    RowChange,
    UsageWriter,
)
from opentela.frontend.limits import Consumption, Limits, check, period_start, refusal_error
from opentela.frontend.local_admission import KeyUsage, LocalAdmission, WindowEntry
from opentela.frontend.pg_calls import ADMIT_CALL
from opentela.frontend.prefix_hashes import unpack
from opentela.frontend.schema import ApiKey, UsageRow

logger = logging.getLogger(__name__)

TRACE_COLUMNS = CSV_COLUMNS
"""The export's columns: the trace schema's (docs/traces.md), so every workload tool reads the export as is."""


def utc_day(ts: float) -> str:
    """YYYY-MM-DD of a timestamp in UTC."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def limits_of(key: ApiKey) -> Limits:
    """The limits stored on a key."""
    return Limits(key.rpm_limit, key.tpm_limit, key.budget_tokens, key.budget_requests, key.budget_period)


@dataclass
class Admission:
    """An admitted request: its usage row id and what is already known about it."""

    row_id: str
    request_id: str
    key_id: str
    model: str
    started_at: float
    input_estimate: int
    limit_headers: dict[str, str] = field(default_factory=dict)
    budget_counter: tuple[str, float] | None = None
    """(period, start) of the key's budget counter this request is counted in; None for keys without a budget."""
    counted_tokens: int = 0
    """The tokens of this request the budget counter holds so far."""
    recorded: asyncio.Future[bool] | None = None
    """The commit of the pending row when admission only queued it (in-memory admission); None once committed."""
    usage: KeyUsage | None = None
    window: WindowEntry | None = None
    """The request's place in the in-memory rate window (in-memory admission only)."""
    changing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held from computing a change's counter delta until it committed: each delta is relative to the last."""
    reasoning: bool | None = None
    """Whether the answer reasoned, once it was read (token_counts.ReasoningSeen); None: unknown."""

    def counter_key(self) -> tuple[str, str, float] | None:
        """(key id, period, start) of the budget counter, if the request is counted in one."""
        return None if self.budget_counter is None else (self.key_id, *self.budget_counter)

    def rate_key(self) -> RateKey:
        """(key id, second) of the rate bucket the request is counted in."""
        return (self.key_id, rate_second(self.started_at))


@dataclass
class Outcome:
    """How a forwarded request ended."""

    status: str  # ok, error, cancelled
    http_status: int | None = None
    provider: str | None = None
    node: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    tokens_estimated: bool = False
    ttft_ms: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def remaining_headers(key: ApiKey, used: Consumption, input_estimate: int) -> dict[str, str]:
    """What is left of each limit after this request was admitted, in OpenAI's x-ratelimit-* style."""
    out: dict[str, str] = {}
    if key.rpm_limit is not None:
        out["x-ratelimit-limit-requests"] = str(key.rpm_limit)
        out["x-ratelimit-remaining-requests"] = str(max(0, key.rpm_limit - used.minute_requests - 1))
    if key.tpm_limit is not None:
        out["x-ratelimit-limit-tokens"] = str(key.tpm_limit)
        out["x-ratelimit-remaining-tokens"] = str(max(0, key.tpm_limit - used.minute_tokens - input_estimate))
    if key.budget_requests is not None:
        out["x-otela-budget-remaining-requests"] = str(max(0, key.budget_requests - used.period_requests - 1))
    if key.budget_tokens is not None:
        out["x-otela-budget-remaining-tokens"] = str(max(0, key.budget_tokens - used.period_tokens))
    return out


def has_rate_limit(key: ApiKey) -> bool:
    """Whether admission checks a per-minute limit for `key`."""
    return key.rpm_limit is not None or key.tpm_limit is not None


EARLY_HEADROOM = 0.1
"""A key is forwarded early (UsageLedger.may_forward_early) while its last admission here left at least this share
of each of its limits."""

EARLY_PAUSE_S = 5.0
"""After a database error in admission, nothing is forwarded early for this long."""

TOUCH_EVERY_S = 1.0
"""A key's last_used_at is written at most this often with in-memory admission."""


def _near_a_limit(limits: Limits, used: Consumption, input_estimate: int) -> bool:
    """Whether a limit has less than EARLY_HEADROOM of it left once this request is counted."""
    pairs = (
        (limits.rpm, used.minute_requests + 1),
        (limits.tpm, used.minute_tokens + input_estimate),
        (limits.budget_requests, used.period_requests + 1),
        (limits.budget_tokens, used.period_tokens + input_estimate),
    )
    return any(limit is not None and after > limit * (1 - EARLY_HEADROOM) for limit, after in pairs)


class UsageLedger:
    """Reads and writes usage rows.

    Two ways to admit. Through the database (the default, and the only one for PostgreSQL): each admission is one
    transaction that locks the key's row, reads its counters and writes the pending row, so replicas sharing the
    database serialize on the key. In memory (`in_memory=True`, for a SQLite file this process alone serves; see
    frontend/local_admission.py): admission is decided without a round trip and the pending row is queued. Either
    way checkpoints and completions go through one group-commit writer (frontend/group_commit.py).
    """

    def __init__(
        self, db: Database, instance: str, *, in_memory: bool = False, forward_early: bool = True
    ) -> None:
        self.db, self.instance = db, instance
        self.clock: Callable[[], float] = time.time
        """Wall-clock time of admissions and completions (tests replay request times through it)."""
        self.writer = UsageWriter(db)
        self.local = LocalAdmission(db) if in_memory else None
        self._tight: set[str] = set()
        """Keys whose last admission here was refused or left less than EARLY_HEADROOM of a limit."""
        self.forward_early = forward_early
        self._early_paused_until = 0.0

    def __repr__(self) -> str:
        mode = "in memory" if self.local is not None else "through the database"
        return f"<UsageLedger {self.instance} admitting {mode}, {self.writer!r}>"

    async def aclose(self) -> None:
        """Commit what is queued and release the writer."""
        await self.writer.aclose()

    def may_forward_early(self, key: ApiKey, input_estimate: int) -> bool:
        """Whether to forward a request of `key` while its admission is decided through the database.

        Admission through the database costs a round trip that would otherwise come before the mesh and the
        engine. A request refused after all has its early forward cancelled, which costs an engine a started
        request: so only keys far from their limits go early, as their last admission here found them (a key not
        seen yet: whether this request alone would come near a limit). In-memory admission decides at once and
        never needs it.
        """
        return (
            self.forward_early
            and self.local is None
            and key.id not in self._tight
            and not _near_a_limit(limits_of(key), Consumption(), input_estimate)
            and time.monotonic() >= self._early_paused_until
        )

    def _note_headroom(self, key: ApiKey, used: Consumption | None, input_estimate: int) -> None:
        if used is None or _near_a_limit(limits_of(key), used, input_estimate):
            self._tight.add(key.id)
        else:
            self._tight.discard(key.id)

    async def admit(
        self,
        key: ApiKey,
        *,
        request_id: str,
        endpoint: str,
        model: str,
        stream: bool,
        input_estimate: int,
        sampling: dict[str, Any] | None,
    ) -> Admission:
        """Check the key's limits and record its pending usage row, or raise 429/402.

        Through the database, the first statement updates the key's row, which takes a lock on it (a row lock on
        PostgreSQL, the write lock on SQLite): concurrent admissions of one key, from any replica, are serialized,
        so two requests cannot both squeeze under the same limit. In memory, the check and the reservation happen
        with no await in between, which serializes them on the event loop.
        """
        row = {
            "request_id": request_id,
            "key_id": key.id,
            "instance": self.instance,
            "endpoint": endpoint,
            "model": model,
            "stream": stream,
            "status": "pending",
            "input_tokens": input_estimate,
            "output_tokens": 0,
            "tokens_estimated": True,
            "sampling": sampling,
        }
        if self.local is not None:
            return await self._admit_in_memory(self.local, key, row, input_estimate)
        now = self.clock()
        row_id = uuid.uuid4().hex
        counter = (key.budget_period, period_start(key.budget_period, now)) if has_budget(key) else None
        limits = limits_of(key)
        full_row = {"id": row_id, "started_at": now, "day": utc_day(now), **row}
        try:
            used = await self._admit_through_database(key, limits, counter, full_row, now)
        except Refused as refused:
            self._note_headroom(key, None, input_estimate)
            raise refusal_error(refused.refusal, now) from None
        except Exception:
            # The database is failing: forward nothing early for a while (it would only be cancelled).
            self._early_paused_until = time.monotonic() + EARLY_PAUSE_S
            raise
        self._note_headroom(key, used, input_estimate)
        return Admission(
            row_id,
            request_id,
            key.id,
            model,
            now,
            input_estimate,
            remaining_headers(key, used, input_estimate),
            counter,
            input_estimate,
        )

    async def _admit_through_database(
        self, key: ApiKey, limits: Limits, counter: tuple[str, float] | None, row: dict[str, Any], now: float
    ) -> Consumption:
        """What the key used before this request, its pending row committed; raises Refused."""
        if self.db.dialect != "postgresql":
            return await self.writer.transaction(admit_transaction, key.id, limits, counter, row, now)
        answer = await self.writer.call(ADMIT_CALL, admit_call(key.id, limits, counter, row, now))
        admitted, m_req, m_tok, oldest, p_req, p_tok = tuple(answer)
        used = window_consumption(m_req, m_tok, oldest, (p_req, p_tok))
        if not admitted:
            refusal = check(limits, used, now)
            assert refusal is not None, f"otela_admit refused what check() admits: {used}, {limits}"
            raise Refused(refusal)
        return used

    async def _admit_in_memory(
        self, local: LocalAdmission, key: ApiKey, row: dict[str, Any], input_estimate: int
    ) -> Admission:
        budget = (
            (key.budget_period, period_start(key.budget_period, self.clock())) if has_budget(key) else None
        )
        usage = await local.usage_of(key.id, budget, self.clock())
        # From here to the reservation nothing awaits: this is what serializes admissions of the key.
        now = self.clock()
        usage.expire(now)
        used = usage.consumption(budget)
        refusal = check(limits_of(key), used, now)
        if refusal is not None:
            raise refusal_error(refusal, now)
        entry = local.reserve(usage, budget, now, input_estimate)
        admission = Admission(
            uuid.uuid4().hex,
            row["request_id"],
            key.id,
            row["model"],
            now,
            input_estimate,
            remaining_headers(key, used, input_estimate),
            budget,
            input_estimate,
            usage=usage,
            window=entry,
        )
        recorded = self.writer.submit(
            RowChange(
                admission.row_id,
                {"id": admission.row_id, "started_at": now, "day": utc_day(now), **row},
                counter=admission.counter_key(),
                delta=(1, input_estimate),
                rate=admission.rate_key(),
            )
        )

        def forget_if_lost(done: asyncio.Future[bool]) -> None:
            if done.cancelled() or done.exception() is not None:
                local.release(usage, entry, budget)

        recorded.add_done_callback(forget_if_lost)
        admission.recorded = recorded
        if now - usage.touched_at >= TOUCH_EVERY_S:
            usage.touched_at = now
            self.writer.touch(key.id, now)
        return admission

    async def recorded(self, admission: Admission) -> None:
        """Wait until the pending row of `admission` is committed; raises the database's error if it failed."""
        if admission.recorded is not None:
            await asyncio.shield(admission.recorded)

    def _correct(self, admission: Admission, tokens: int) -> None:
        """Count a committed token correction in memory too."""
        if admission.usage is not None and admission.window is not None:
            assert self.local is not None
            self.local.correct(admission.usage, admission.window, admission.budget_counter, tokens)

    async def checkpoint(
        self, admission: Admission, output_tokens: int, provider: str | None, node: str | None
    ) -> None:
        """Record progress of a long stream, so an interrupted one keeps what was already delivered."""
        async with admission.changing:
            tokens = admission.input_estimate + output_tokens
            delta = tokens - admission.counted_tokens
            change = RowChange(
                admission.row_id,
                {"output_tokens": output_tokens, "provider": provider, "node": node},
                CHECKPOINT,
                counter=admission.counter_key(),
                delta=(0, delta),
                rate=admission.rate_key(),
            )
            if await self.writer.submit(change):
                admission.counted_tokens = tokens
                self._correct(admission, delta)

    async def complete(self, admission: Admission, outcome: Outcome) -> None:
        """Finish the row; called before the last byte of the response goes to the client. Returns once the
        row is committed (sharing the commit with whatever else was queued)."""
        async with admission.changing:
            await self._complete(admission, outcome)

    async def _complete(self, admission: Admission, outcome: Outcome) -> None:
        now = self.clock()
        tokens = outcome.input_tokens + outcome.output_tokens
        delta = tokens - admission.counted_tokens
        change = RowChange(
            admission.row_id,
            {
                "status": outcome.status,
                "http_status": outcome.http_status,
                "provider": outcome.provider,
                "node": outcome.node,
                "input_tokens": outcome.input_tokens,
                "output_tokens": outcome.output_tokens,
                "tokens_estimated": outcome.tokens_estimated,
                "finished_at": now,
                "latency_ms": round((now - admission.started_at) * 1000, 3),
                "ttft_ms": outcome.ttft_ms,
                "error": outcome.error,
            },
            COMPLETE,
            counter=admission.counter_key(),
            delta=(0, delta),
            rate=admission.rate_key(),
        )
        done = self.writer.submit(change)
        await self.recorded(admission)
        await done
        admission.counted_tokens = tokens
        self._correct(admission, delta)

    async def reconcile(self, stale_after: float) -> int:
        """Mark pending rows left by a crash as interrupted: this replica's own, and any replica's stale ones."""
        now = time.time()
        statement = (
            update(UsageRow)
            .where(
                UsageRow.status == "pending",
                or_(UsageRow.instance == self.instance, UsageRow.started_at < now - stale_after),
            )
            .values(
                status="interrupted",
                finished_at=now,
                error="the frontend stopped before this request completed; tokens are what was known then",
            )
        )
        async with self.db.session() as s, s.begin():
            # An UPDATE yields a CursorResult (it has rowcount); execute() is annotated with the general Result.
            result = cast(CursorResult[Any], await s.execute(statement))
        count = result.rowcount or 0
        if count:
            logger.warning("marked %d pending usage rows interrupted after a restart", count)
        return count

    async def rebuild_counters(self) -> int:
        """Recompute every budget counter and rate bucket from the usage rows (they are the truth); how many
        budget counters there are."""
        async with self.db.engine.begin() as conn:
            budgets = await conn.run_sync(rebuild_counters_sync)
            await conn.run_sync(rebuild_rate_sync, time.time())
            return budgets

    async def rows(
        self, *, key_id: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[UsageRow]:
        """Newest rows first."""
        q = select(UsageRow).order_by(UsageRow.started_at.desc()).limit(limit)
        if key_id is not None:
            q = q.where(UsageRow.key_id == key_id)
        if since is not None:
            q = q.where(UsageRow.started_at >= since)
        async with self.db.session() as s:
            return list((await s.scalars(q)).all())

    async def aggregates(
        self, *, key_id: str | None = None, since_day: str | None = None
    ) -> list[dict[str, Any]]:
        """Requests and tokens per key, model and UTC day."""
        q = (
            select(
                UsageRow.key_id,
                UsageRow.model,
                UsageRow.day,
                func.count(),
                func.coalesce(func.sum(UsageRow.input_tokens), 0),
                func.coalesce(func.sum(UsageRow.output_tokens), 0),
                func.coalesce(func.sum(case((UsageRow.status != "ok", 1), else_=0)), 0),
            )
            .group_by(UsageRow.key_id, UsageRow.model, UsageRow.day)
            .order_by(UsageRow.day, UsageRow.key_id, UsageRow.model)
        )
        if key_id is not None:
            q = q.where(UsageRow.key_id == key_id)
        if since_day is not None:
            q = q.where(UsageRow.day >= since_day)
        async with self.db.session() as s:
            result = await s.execute(q)
            return [
                {
                    "key_id": k,
                    "model": m,
                    "day": d,
                    "requests": int(n),
                    "input_tokens": int(i),
                    "output_tokens": int(o),
                    "failed": int(f),
                }
                for k, m, d, n, i, o, f in result.all()
            ]

    async def series(self, *, key_id: str | None, since: float, bucket_s: int) -> list[dict[str, Any]]:
        """Tokens and requests per time bucket since `since` (for the dashboard's chart)."""
        q = select(UsageRow.started_at, UsageRow.input_tokens, UsageRow.output_tokens).where(
            UsageRow.started_at >= since
        )
        if key_id is not None:
            q = q.where(UsageRow.key_id == key_id)
        buckets: dict[int, list[int]] = {}
        async with self.db.session() as s:
            for started, inp, out in (await s.execute(q)).all():
                b = buckets.setdefault(int(started // bucket_s) * bucket_s, [0, 0, 0])
                b[0] += 1
                b[1] += inp
                b[2] += out
        return [
            {"t": t, "requests": n, "input_tokens": i, "output_tokens": o}
            for t, (n, i, o) in sorted(buckets.items())
        ]

    async def export_trace(
        self, *, since: float | None = None, until: float | None = None
    ) -> AsyncIterator[str]:
        """The trace as `write_trace`'s CSV: completed requests of keys that did not opt out; no content, no key."""
        q = (
            select(
                UsageRow.started_at,
                UsageRow.model,
                UsageRow.input_tokens,
                UsageRow.output_tokens,
                UsageRow.sampling,
                UsageRow.latency_ms,
                UsageRow.ttft_ms,
                UsageRow.reasoning,
                UsageRow.prefix_hashes,
            )
            .join(ApiKey, ApiKey.id == UsageRow.key_id)
            .where(UsageRow.status == "ok", ApiKey.log_content.is_(True))
            .order_by(UsageRow.started_at)
        )
        if since is not None:
            q = q.where(UsageRow.started_at >= since)
        if until is not None:
            q = q.where(UsageRow.started_at < until)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(TRACE_COLUMNS)
        async with self.db.session() as s:
            result = await s.stream(q.execution_options(yield_per=500))
            async for started, model, inp, outp, sampling, latency_ms, ttft_ms, reasoning, hashes in result:
                try:
                    record = TraceRecord(
                        timestamp=started,
                        model=model,
                        input_tokens=inp,
                        output_tokens=outp,
                        **sampling_values(sampling or {}),
                        e2e_s=None if latency_ms is None else latency_ms / 1000,
                        ttft_s=None if ttft_ms is None else ttft_ms / 1000,
                        reasoning=reasoning,
                        prefix_hashes=unpack(hashes),
                    )
                except ValueError as exc:
                    logger.warning("usage row left out of the trace export: %s", exc)
                    continue
                writer.writerow(csv_row(record))
                if out.tell() > 64 * 1024:
                    yield out.getvalue()
                    out.seek(0)
                    out.truncate()
        yield out.getvalue()
