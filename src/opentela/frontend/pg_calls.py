"""The frontend's hot path on PostgreSQL: admission and completion as one call each to the functions that migration
0003 installs (frontend/migrations/versions/0003_rate_buckets.py).

Done as separate statements, an admission took six round trips (begin, lock the key, read the window and counter,
insert the row, add to the counter, commit) and a completion five, each paying the network and the driver: about
3 ms of database time per request on loopback. One statement in its own implicit transaction is one round trip;
the logic stays the one of frontend/usage.py and frontend/group_commit.py, and the SQLite path runs the same steps as
Python statements (tests run both, and hold the functions' limit check to `limits.check`).

The two calls go through `PostgresCalls`, a pool of plain asyncpg connections of their own, rather than through
SQLAlchemy's engine: its async layer (pool checkout, greenlet hand-offs, result wrapping) cost more than the round
trip itself, 0.86 ms a completion against 0.43 ms for the same call on asyncpg (p50, loopback, this machine). The
pool hands connections back without asyncpg's reset query (another round trip each time): the calls leave no session
state, and a transaction left open is still rolled back. Driver errors leave as SQLAlchemy's, so the frontend's
handlers treat them as they treat those of the engine (an outage answers 503, a bug 500).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import TextClause, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

POOL_SIZE = 10
"""Connections the calls keep at most (each replica); more concurrent calls wait for one."""


@dataclass(frozen=True)
class Call:
    """One call with named parameters: `statement` for a SQLAlchemy connection, `sql` and `names` for asyncpg."""

    statement: TextClause
    sql: str
    names: tuple[str, ...]

    def args(self, params: dict[str, Any]) -> list[Any]:
        """The parameters in the positional order of `sql`."""
        return [params[name] for name in self.names]


def _call(named_sql: str) -> Call:
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    return Call(text(named_sql), re.sub(r"(?<!:):(\w+)", positional, named_sql), tuple(names))


ADMIT_CALL = _call(
    "SELECT admitted, minute_requests, minute_tokens, oldest_second, period_requests, period_tokens"
    " FROM otela_admit(:p_key, :p_now, :p_second, :p_slot, :p_since, :p_period, :p_start,"
    " :p_rpm, :p_tpm, :p_budget_requests, :p_budget_tokens,"
    " :p_id, :p_request_id, :p_instance, :p_endpoint, :p_model, :p_stream, :p_input_tokens, :p_day,"
    " CAST(:p_sampling AS json))"
)
"""Admit one request: (admitted, minute requests, minute tokens, oldest bucket, period requests, period tokens)."""

COMPLETE_CALL = _call(
    "SELECT otela_complete(:p_id, :p_status, :p_http_status, :p_provider, :p_node, :p_input_tokens,"
    " :p_output_tokens, :p_tokens_estimated, :p_finished_at, :p_latency_ms, :p_ttft_ms, :p_error,"
    " :p_key, :p_period, :p_start, :p_second, :p_slot, :p_delta)"
)
"""Complete one request's row and add its token difference to its counters; whether the row was there."""

WITHIN_LIMITS_CALL = text(
    "SELECT otela_within_limits(:minute_requests, :minute_tokens, :period_requests, :period_tokens,"
    " :rpm, :tpm, :budget_requests, :budget_tokens)"
)
"""The functions' limit check alone (for tests holding it to `limits.check`)."""


def prefixed(values: dict[str, Any]) -> dict[str, Any]:
    """Bound parameters named as the functions name them."""
    return {"p_" + k: v for k, v in values.items()}


async def _keep_session(_connection: asyncpg.Connection) -> None:
    """Hand a connection back as it is (asyncpg has already rolled back a transaction left open)."""


def _as_sqlalchemy_error(call: Call, exc: BaseException) -> DBAPIError:
    """A driver error as the SQLAlchemy error the engine would have raised for it."""
    kind: type[DBAPIError] = OperationalError  # the server or the connection is failing: an outage
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        kind = IntegrityError
    elif isinstance(exc, asyncpg.DataError):
        kind = DataError
    elif isinstance(exc, asyncpg.SyntaxOrAccessError):
        kind = ProgrammingError
    return kind(call.sql, None, exc if isinstance(exc, Exception) else Exception(str(exc)))


_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


class PostgresCalls:
    """The frontend's hot-path calls on a small asyncpg pool of their own (see the module's docstring)."""

    def __init__(self, engine: AsyncEngine, size: int = POOL_SIZE) -> None:
        _args, kwargs = engine.dialect.create_connect_args(engine.url)
        # SQLAlchemy's own options in the URL's query mean nothing to asyncpg.
        for option in ("prepared_statement_cache_size", "prepared_statement_name_func", "async_creator_fn"):
            kwargs.pop(option, None)
        self._connect = kwargs
        self._size = size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<PostgresCalls {self._connect.get('host')}:{self._connect.get('port')} open={self._pool is not None}>"

    async def _ready(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    # Opened on first use and kept; a server that is down fails this call, and the next one tries
                    # again. Connections the server closed are reopened by the pool when next handed out.
                    self._pool = await asyncpg.create_pool(
                        min_size=0, max_size=self._size, reset=_keep_session, **self._connect
                    )
        return self._pool

    async def one(self, call: Call, params: dict[str, Any]) -> asyncpg.Record:
        """Run `call` in a transaction of its own; its one row."""
        try:
            pool = await self._ready()
            async with pool.acquire() as conn:
                row = await conn.fetchrow(call.sql, *call.args(params))
        except _DRIVER_ERRORS as exc:
            raise _as_sqlalchemy_error(call, exc) from exc
        assert row is not None, f"{call.sql} returned no row"
        return row

    async def each(self, call: Call, params: Sequence[dict[str, Any]]) -> list[Any]:
        """Run `call` once per parameter set, all in one transaction, in the order given; the first column of each."""
        try:
            pool = await self._ready()
            async with pool.acquire() as conn, conn.transaction():
                return [await conn.fetchval(call.sql, *call.args(p)) for p in params]
        except _DRIVER_ERRORS as exc:
            raise _as_sqlalchemy_error(call, exc) from exc

    async def aclose(self) -> None:
        """Close the pool's connections."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
