"""Counters kept next to the usage rows: each budget key's use per budget period, and every key's use per second
of the rate window.

The usage rows are the source of truth. A counter changes only in the transaction that writes the rows it sums
(admission adds a request and its estimated prompt; completion and checkpoints add the difference to the row's final
tokens), so after any commit, crash or not, every counter equals the sum of its rows, and `rebuild_counters_sync`
and `rebuild_rate_sync` can recompute them from the rows.

Rate counters are one-second buckets in a ring of RATE_SLOTS rows per key. A request started at t is counted in
bucket floor(t), and a bucket counts while it is at most RATE_WINDOW_S seconds older than the current second: a
request weighs on the per-minute limits for 60 to 61 seconds, never less, so the buckets never admit more than an
exact sliding minute would. A completion's token difference goes to its bucket only while the bucket still holds
that second (a request longer than the window has left it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from opentela.frontend.limits import RATE_WINDOW_S, Consumption, period_start
from opentela.frontend.schema import ApiKey, UsageCounter, UsageRate, UsageRow

RATE_SLOTS = 64
"""Rate buckets per key: more than the RATE_WINDOW_S + 1 seconds a window spans, so no live bucket is overwritten."""
RateKey = tuple[str, int]
"""(key id, second) of one rate bucket."""


def has_budget(key: ApiKey) -> bool:
    """Whether admission checks a budget for `key` (only such keys have counters)."""
    return key.budget_tokens is not None or key.budget_requests is not None


THIS_COUNTER = (
    UsageCounter.key_id == bindparam("b_key_id"),
    UsageCounter.period == bindparam("b_period"),
    UsageCounter.start == bindparam("b_start"),
)
"""The counter named by the bound parameters b_key_id, b_period and b_start."""
READ_COUNTER = select(UsageCounter.requests, UsageCounter.tokens).where(*THIS_COUNTER)


async def read_counter(s: Any, key_id: str, period: str, start: float) -> tuple[int, int]:
    """(requests, tokens) of one key's budget period; zero when nothing was counted yet."""
    row = (await s.execute(READ_COUNTER, {"b_key_id": key_id, "b_period": period, "b_start": start})).first()
    return (int(row[0]), int(row[1])) if row is not None else (0, 0)


def counter_upsert(dialect: str, key_id: Any, period: Any, start: Any, requests: Any, tokens: Any) -> Any:
    """The statement adding to one counter, creating it at zero first when it is new (values or bound parameters)."""
    make = pg_insert if dialect == "postgresql" else sqlite_insert
    statement = make(UsageCounter).values(
        key_id=key_id, period=period, start=start, requests=requests, tokens=tokens
    )
    return statement.on_conflict_do_update(
        index_elements=[UsageCounter.key_id, UsageCounter.period, UsageCounter.start],
        set_={
            "requests": UsageCounter.requests + statement.excluded.requests,
            "tokens": UsageCounter.tokens + statement.excluded.tokens,
        },
    )


def counters_from_rows(connection: Connection) -> dict[tuple[str, str, float], tuple[int, int]]:
    """Every counter as the rows say it should be: (key, period, start) -> (requests, tokens)."""
    periods = {
        key_id: period
        for key_id, period, tokens, requests in connection.execute(
            select(ApiKey.id, ApiKey.budget_period, ApiKey.budget_tokens, ApiKey.budget_requests)
        )
        if tokens is not None or requests is not None
    }
    sums: dict[tuple[str, str, float], list[int]] = defaultdict(lambda: [0, 0])
    if not periods:
        return {}
    rows = connection.execute(
        select(UsageRow.key_id, UsageRow.started_at, UsageRow.input_tokens + UsageRow.output_tokens)
        .where(UsageRow.key_id.in_(list(periods)))
        .execution_options(yield_per=5000)  # streamed: a key's history may hold millions of rows
    )
    for key_id, started_at, tokens in rows:
        period = periods[key_id]
        total = sums[(key_id, period, period_start(period, started_at))]
        total[0] += 1
        total[1] += int(tokens)
    return {k: (v[0], v[1]) for k, v in sums.items()}


def stored_counters(connection: Connection) -> dict[tuple[str, str, float], tuple[int, int]]:
    """Every counter as stored."""
    rows = connection.execute(
        select(
            UsageCounter.key_id,
            UsageCounter.period,
            UsageCounter.start,
            UsageCounter.requests,
            UsageCounter.tokens,
        )
    )
    return {(k, p, s): (int(r), int(t)) for k, p, s, r, t in rows}


def rebuild_counters_sync(connection: Connection) -> int:
    """Replace every counter with the sums of the usage rows; returns how many counters there are.

    On PostgreSQL the counters table is locked first, so admissions of other replicas wait for the rebuild
    (their transactions already under way finish first, and their rows are then counted).
    """
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("LOCK TABLE usage_counters IN EXCLUSIVE MODE")
    truth = counters_from_rows(connection)
    connection.execute(delete(UsageCounter))
    if truth:
        connection.execute(
            insert(UsageCounter),
            [
                {"key_id": k, "period": p, "start": s, "requests": r, "tokens": t}
                for (k, p, s), (r, t) in truth.items()
            ],
        )
    return len(truth)


def rate_second(ts: float) -> int:
    """The rate bucket of a request started at `ts`."""
    return math.floor(ts)


def rate_since(now: float) -> int:
    """The oldest bucket still in the rate window at `now`."""
    return math.floor(now) - int(RATE_WINDOW_S)


def rate_slot(second: int) -> int:
    """The row of the key's ring that holds bucket `second`."""
    return second % RATE_SLOTS


READ_RATE = select(
    func.coalesce(func.sum(UsageRate.requests), 0),
    func.coalesce(func.sum(UsageRate.tokens), 0),
    func.min(UsageRate.second),
).where(UsageRate.key_id == bindparam("b_key_id"), UsageRate.second >= bindparam("b_since"))
"""Requests, tokens and oldest bucket of one key's rate window (bound: b_key_id, b_since)."""


def window_consumption(
    requests: int, tokens: int, oldest: int | None, period: tuple[int, int]
) -> Consumption:
    """What a key used, from its rate buckets and budget counter: a bucket leaves the window a second after the
    exact minute of its oldest request would."""
    return Consumption(requests, tokens, None if oldest is None else oldest + 1.0, period[0], period[1])


def rate_upsert(dialect: str) -> Any:
    """The statement adding a new request to its bucket (bound: b_key_id, b_slot, b_second, b_requests, b_tokens),
    taking over the slot when it still holds an older second."""
    make = pg_insert if dialect == "postgresql" else sqlite_insert
    statement = make(UsageRate).values(
        key_id=bindparam("b_key_id"),
        slot=bindparam("b_slot"),
        second=bindparam("b_second"),
        requests=bindparam("b_requests"),
        tokens=bindparam("b_tokens"),
    )
    newer = statement.excluded.second > UsageRate.second
    # A replica whose clock lags adds to the newer bucket it finds: counted a little longer, never less.
    return statement.on_conflict_do_update(
        index_elements=[UsageRate.key_id, UsageRate.slot],
        set_={
            "requests": case(
                (newer, statement.excluded.requests), else_=UsageRate.requests + statement.excluded.requests
            ),
            "tokens": case(
                (newer, statement.excluded.tokens), else_=UsageRate.tokens + statement.excluded.tokens
            ),
            "second": case((newer, statement.excluded.second), else_=UsageRate.second),
        },
    )


ADD_RATE_TOKENS = (
    update(UsageRate)
    .where(
        UsageRate.key_id == bindparam("b_key_id"),
        UsageRate.slot == bindparam("b_slot"),
        UsageRate.second == bindparam("b_second"),
    )
    .values(tokens=UsageRate.tokens + bindparam("b_tokens"))
)
"""A token correction to a bucket that still holds its second (bound: b_key_id, b_slot, b_second, b_tokens)."""


def rate_from_rows(connection: Connection, now: float) -> dict[RateKey, tuple[int, int]]:
    """Every rate bucket in the window at `now` as the rows say it should be: (key, second) -> (requests, tokens)."""
    sums: dict[RateKey, list[int]] = defaultdict(lambda: [0, 0])
    rows = connection.execute(
        select(UsageRow.key_id, UsageRow.started_at, UsageRow.input_tokens + UsageRow.output_tokens).where(
            UsageRow.started_at >= rate_since(now)
        )
    )
    for key_id, started_at, tokens in rows:
        total = sums[(key_id, rate_second(started_at))]
        total[0] += 1
        total[1] += int(tokens)
    return {k: (v[0], v[1]) for k, v in sums.items()}


def stored_rate(connection: Connection, now: float) -> dict[RateKey, tuple[int, int]]:
    """Every rate bucket in the window at `now`, as stored."""
    rows = connection.execute(
        select(UsageRate.key_id, UsageRate.second, UsageRate.requests, UsageRate.tokens).where(
            UsageRate.second >= rate_since(now)
        )
    )
    return {(k, int(s)): (int(r), int(t)) for k, s, r, t in rows}


def rebuild_rate_sync(connection: Connection, now: float) -> int:
    """Replace every rate bucket with the sums of the rows of the window at `now`; returns how many there are."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("LOCK TABLE usage_rate IN EXCLUSIVE MODE")
    truth = rate_from_rows(connection, now)
    connection.execute(delete(UsageRate))
    if truth:
        connection.execute(
            insert(UsageRate),
            [
                {"key_id": k, "slot": rate_slot(s), "second": s, "requests": r, "tokens": t}
                for (k, s), (r, t) in truth.items()
            ],
        )
    return len(truth)
