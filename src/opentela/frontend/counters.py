"""Budget counters: what each key with a budget used per budget period, kept next to the usage rows.

The usage rows are the source of truth. A counter changes only in the transaction that writes the rows it sums
(admission adds a request and its estimated prompt; completion and checkpoints add the difference to the row's final
tokens), so after any commit, crash or not, every counter equals the sum of its rows, and `rebuild_counters_sync`
can recompute all of them from the rows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from opentela.frontend.limits import period_start
from opentela.frontend.schema import ApiKey, UsageCounter, UsageRow


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
