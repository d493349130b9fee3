"""The per-minute limits through the database: each request counts in its one-second bucket, for 60 to 61 seconds,
in a ring of RATE_SLOTS rows per key, on SQLite and on PostgreSQL (whose admission and completion are the functions of
migration 0003, held here to the same model and to `limits.check`)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator

import pytest
from frontend_helpers import admit
from frontend_services import PostgresServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from opentela.frontend.counters import RATE_SLOTS, rate_from_rows, stored_rate
from opentela.frontend.db import Database
from opentela.frontend.errors import RateLimitExceededError
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.limits import Consumption, Limits, check
from opentela.frontend.pg_calls import WITHIN_LIMITS_CALL
from opentela.frontend.schema import UsageRate
from opentela.frontend.usage import Admission, Outcome, UsageLedger

# Gaps between requests: bursts, bucket edges, the window's edges, and gaps that make the ring wrap.
GAPS = st.one_of(
    st.sampled_from([0.0, 0.0, 0.3, 0.999, 1.0, 59.5, 60.0, 60.4, 61.0, 64.0, 130.0]),
    st.floats(0, 9, allow_nan=False),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(st.tuples(GAPS, st.integers(0, 40), st.integers(-20, 60)), min_size=1, max_size=45),
    rpm=st.integers(1, 6),
    tpm=st.one_of(st.none(), st.integers(1, 200)),
)
async def test_database_admission_matches_the_one_second_bucket_model(
    db_url: str, requests: list[tuple[float, int, int]], rpm: int, tpm: int | None
) -> None:
    """Requests at replayed times, each completed with a token count other than its estimate: every decision and
    every retry-after is the model's, the ring never holds more than RATE_SLOTS rows, and the stored buckets of the
    window equal the rows'."""
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(name=uuid.uuid4().hex, rpm_limit=rpm, tpm_limit=tpm))
        ledger = UsageLedger(db, "t")
        now = 1_800_000_000.0
        ledger.clock = lambda: now
        counted: list[tuple[float, int]] = []  # (started at, tokens) of every admitted request
        for gap, estimate, extra in requests:
            now += gap
            window = [(t, k) for t, k in counted if math.floor(t) >= math.floor(now) - 60]
            used = (len(window), sum(k for _, k in window))
            refused = used[0] >= rpm or (tpm is not None and used[1] >= tpm)
            try:
                adm = await admit(ledger, key, estimate)
            except RateLimitExceededError as exc:
                assert refused, (used, rpm, tpm)
                frees = min(math.floor(t) for t, _ in window) + 61
                assert exc.details["retry_after"] == pytest.approx(frees - now, abs=1e-6)
                continue
            assert not refused, (used, rpm, tpm)
            final = max(0, estimate + extra)
            await ledger.complete(adm, Outcome("ok", 200, input_tokens=final, output_tokens=0))
            counted.append((now, final))
        async with db.engine.connect() as conn:
            ring = (await conn.execute(select(func.count()).where(UsageRate.key_id == key.id))).scalar_one()
            stored = await conn.run_sync(stored_rate, now)
            truth = await conn.run_sync(rate_from_rows, now)
        mine = {k: v for k, v in stored.items() if k[0] == key.id}
        assert ring <= RATE_SLOTS and mine == {k: v for k, v in truth.items() if k[0] == key.id}
        await ledger.aclose()
    finally:
        await db.aclose()


async def test_a_completion_after_its_bucket_left_the_ring_changes_no_other_bucket(db_url: str) -> None:
    """A request longer than the window: its bucket's slot was taken by a newer second, which keeps its count."""
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="long", tpm_limit=10**6))
        ledger = UsageLedger(db, "t")
        now = 1_800_000_000.0
        ledger.clock = lambda: now
        long = await admit(ledger, key, 10)
        now += RATE_SLOTS  # the same slot, a newer second
        short = await admit(ledger, key, 5)
        await ledger.complete(long, Outcome("ok", 200, input_tokens=10, output_tokens=500))
        await ledger.complete(short, Outcome("ok", 200, input_tokens=5, output_tokens=1))
        async with db.engine.connect() as conn:
            assert await conn.run_sync(stored_rate, now) == {(key.id, int(now)): (1, 6)}
        await ledger.aclose()
    finally:
        await db.aclose()


LIMIT = st.one_of(st.none(), st.integers(0, 6))


@pytest.fixture
async def pg_database(postgres: PostgresServer) -> AsyncIterator[Database]:
    """A migrated database on the session's PostgreSQL."""
    db = await Database.open(postgres.create_database(f"check_{uuid.uuid4().hex[:8]}"))
    yield db
    await db.aclose()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    used=st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6), st.integers(0, 6)),
    limits=st.tuples(LIMIT, LIMIT, LIMIT, LIMIT),
)
async def test_the_postgresql_limit_check_is_check(
    pg_database: Database, used: tuple[int, int, int, int], limits: tuple[int | None, ...]
) -> None:
    """`otela_within_limits` admits exactly what `limits.check` admits."""
    minute_requests, minute_tokens, period_requests, period_tokens = used
    rpm, tpm, budget_requests, budget_tokens = limits
    async with pg_database.engine.connect() as conn:
        within = (
            await conn.execute(
                WITHIN_LIMITS_CALL,
                {
                    "minute_requests": minute_requests,
                    "minute_tokens": minute_tokens,
                    "period_requests": period_requests,
                    "period_tokens": period_tokens,
                    "rpm": rpm,
                    "tpm": tpm,
                    "budget_requests": budget_requests,
                    "budget_tokens": budget_tokens,
                },
            )
        ).scalar_one()
    expected = check(
        Limits(rpm, tpm, budget_tokens, budget_requests),
        Consumption(minute_requests, minute_tokens, None, period_requests, period_tokens),
        1_800_000_000.0,
    )
    assert within == (expected is None)


async def test_requests_keep_working_across_a_postgresql_restart(postgres: PostgresServer) -> None:
    """The pool hands out no connection the server closed: the first request after a restart succeeds."""
    db = await Database.open(postgres.create_database(f"restart_{uuid.uuid4().hex[:8]}"))
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="r", rpm_limit=100, budget_tokens=10**6))
        ledger = UsageLedger(db, "t")

        async def one() -> Admission:
            adm = await admit(ledger, key)
            await ledger.complete(adm, Outcome("ok", 200, input_tokens=10, output_tokens=1))
            return adm

        await one()
        postgres.restart()
        await asyncio.sleep(
            0.2
        )  # a serving loop runs meanwhile, and its connections see the server's goodbye
        await one()
        await KeyStore(db).get(key.id)  # sessions too
        await ledger.aclose()
    finally:
        await db.aclose()
