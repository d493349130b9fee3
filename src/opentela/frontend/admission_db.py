"""Admission through the database: one transaction that locks the key's row, reads its rate buckets and budget
counter, checks, and writes the pending row with its counter deltas; on PostgreSQL the same steps as one call of
`otela_admit` (frontend/pg_calls.py). `UsageLedger` (frontend/usage.py) uses it where admission is not decided in
memory.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from opentela.frontend.counters import (
    READ_RATE,
    THIS_COUNTER,
    rate_second,
    rate_since,
    rate_slot,
    window_consumption,
)
from opentela.frontend.group_commit import TOUCH_KEY, UPSERT_COUNTER, UPSERT_RATE
from opentela.frontend.limits import Consumption, Limits, Refusal, check
from opentela.frontend.pg_calls import prefixed
from opentela.frontend.schema import UsageCounter, UsageRow


class Refused(Exception):
    """Raised inside the admission transaction to roll it back."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


_RATE_AND_COUNTER = READ_RATE.add_columns(
    select(UsageCounter.requests).where(*THIS_COUNTER).scalar_subquery(),
    select(UsageCounter.tokens).where(*THIS_COUNTER).scalar_subquery(),
)


def admit_transaction(
    conn: Connection,
    key_id: str,
    limits: Limits,
    counter: tuple[str, float] | None,
    row: dict[str, Any],
    now: float,
) -> Consumption:
    """Admission through the database, in one transaction: what the key used, its pending row and its counters.

    The first statement updates the key's row, which locks it (a row lock on PostgreSQL, the write lock on SQLite),
    so concurrent admissions of one key, from any replica, are serialized. PostgreSQL runs the same steps as one
    call of `otela_admit` (frontend/pg_calls.py).
    """
    conn.execute(TOUCH_KEY, {"b_key_id": key_id, "b_when": now})
    p_req = p_tok = 0
    window = {"b_key_id": key_id, "b_since": rate_since(now)}
    # At most RATE_SLOTS rate buckets and one counter row, whatever the key's history or rate: one round trip.
    if counter is not None:
        budget = {"b_period": counter[0], "b_start": counter[1]}
        m_req, m_tok, oldest, p_req, p_tok = conn.execute(_RATE_AND_COUNTER, {**window, **budget}).one()
    else:
        m_req, m_tok, oldest = conn.execute(READ_RATE, window).one()
    used = window_consumption(int(m_req), int(m_tok), oldest, (int(p_req or 0), int(p_tok or 0)))
    refusal = check(limits, used, now)
    if refusal is not None:
        raise Refused(refusal)
    conn.execute(insert(UsageRow), row)
    second = rate_second(now)
    delta = {"b_key_id": key_id, "b_requests": 1, "b_tokens": row["input_tokens"]}
    conn.execute(UPSERT_RATE[conn.dialect.name], {**delta, "b_slot": rate_slot(second), "b_second": second})
    if counter is not None:
        conn.execute(
            UPSERT_COUNTER[conn.dialect.name], {**delta, "b_period": counter[0], "b_start": counter[1]}
        )
    return used


def admit_call(
    key_id: str, limits: Limits, counter: tuple[str, float] | None, row: dict[str, Any], now: float
) -> dict[str, Any]:
    """The parameters of `otela_admit` (PostgreSQL) for the same admission as `admit_transaction`."""
    second = rate_second(now)
    period, start = counter if counter is not None else (None, None)
    return prefixed(
        {
            "key": key_id,
            "now": now,
            "second": second,
            "slot": rate_slot(second),
            "since": rate_since(now),
            "period": period,
            "start": start,
            "rpm": limits.rpm,
            "tpm": limits.tpm,
            "budget_requests": limits.budget_requests,
            "budget_tokens": limits.budget_tokens,
            **{k: row[k] for k in ("id", "request_id", "instance", "endpoint", "model", "stream", "day")},
            "input_tokens": row["input_tokens"],
            "sampling": None if row["sampling"] is None else json.dumps(row["sampling"]),
        }
    )
