"""Budget counters: admission reads one counter, and every counter equals the sum of its usage rows."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from frontend_helpers import admit, counters, rates
from sqlalchemy import insert

from opentela.frontend.db import Database, sqlite_url
from opentela.frontend.errors import BudgetExceededError
from opentela.frontend.keys import KeySettings, KeyStore, new_key
from opentela.frontend.schema import ApiKey, UsageRow
from opentela.frontend.usage import Admission, Outcome, UsageLedger


async def test_counters_follow_every_row_change_and_rebuild_to_the_same(db_url: str) -> None:
    """Admissions, checkpoints, completions of every kind and crash reconciliation, in random order: the budget
    counters and the rate buckets equal what the rows say, and a rebuild leaves them as they were."""
    await _follow_every_change(db_url, in_memory=False)


async def test_counters_follow_every_row_change_with_in_memory_admission(tmp_path: Path) -> None:
    """The same with admission decided in memory (a SQLite file one process serves): the queued writes keep the
    stored counters and buckets equal to the rows."""
    await _follow_every_change(sqlite_url(tmp_path / "frontend.db"), in_memory=True)


async def _follow_every_change(db_url: str, *, in_memory: bool) -> None:
    db = await Database.open(db_url)
    rng = random.Random(7)
    try:
        store = KeyStore(db)
        keys = [
            (await store.create(KeySettings(budget_tokens=10**9, budget_period=period)))[0]
            for period in ("day", "week", "month", "total")
        ]
        keys.append((await store.create(KeySettings()))[0])  # no budget: no counter
        ledger = UsageLedger(db, "t", in_memory=in_memory)
        open_requests: list[Admission] = []
        admitted = 0
        for _ in range(120):
            action = rng.random()
            if action < 0.45 or not open_requests:
                open_requests.append(await admit(ledger, rng.choice(keys), rng.randint(0, 50)))
                admitted += 1
            elif action < 0.6:
                await ledger.checkpoint(rng.choice(open_requests), rng.randint(0, 99), "p", "n")
            else:
                adm = open_requests.pop(rng.randrange(len(open_requests)))
                status = rng.choice(["ok", "ok", "error", "cancelled"])
                await ledger.complete(
                    adm, Outcome(status, 200, "p", "n", rng.randint(0, 80), rng.randint(0, 80))
                )
        await ledger.writer.flush()
        await ledger.reconcile(stale_after=3600)  # what is still open becomes interrupted, tokens kept
        live, truth = await counters(db)
        assert live == truth and len(live) == 4
        live_rate, rate_truth = await rates(db)
        assert live_rate == rate_truth and sum(r for r, _ in live_rate.values()) == admitted
        assert await ledger.rebuild_counters() == 4
        assert (await counters(db))[0] == live and (await rates(db))[0] == live_rate
    finally:
        await db.aclose()


async def test_a_token_budget_holds_under_concurrent_admissions_from_two_replicas(db_url: str) -> None:
    """Each admission reserves its prompt estimate in the counter under the key's lock: 30 racing for a budget of
    100 tokens at 10 each get exactly 10 through, across two ledgers."""
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(budget_tokens=100, budget_period="day"))
        ledgers = [UsageLedger(db, "a"), UsageLedger(db, "b")]
        results = await asyncio.gather(
            *(admit(ledgers[i % 2], key) for i in range(30)), return_exceptions=True
        )
        assert sum(not isinstance(r, BaseException) for r in results) == 10
        assert all(isinstance(r, BudgetExceededError) for r in results if isinstance(r, BaseException))
    finally:
        await db.aclose()


async def test_budget_admission_reads_the_counter_not_the_history(db_url: str) -> None:
    """100,000 old rows in the period count through the counter the migration or a rebuild made from them."""
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(budget_requests=100_002, budget_period="total"))
        now = time.time()
        rows = [
            {
                "id": f"{i:032x}",
                "request_id": "old",
                "key_id": key.id,
                "instance": "t",
                "endpoint": "/v1/chat/completions",
                "model": "m",
                "stream": False,
                "status": "ok",
                "input_tokens": 1,
                "output_tokens": 1,
                "tokens_estimated": False,
                "started_at": now - 3600 - i,
                "day": "2026-01-01",
            }
            for i in range(100_000)
        ]
        async with db.session() as s, s.begin():
            await s.execute(insert(UsageRow), rows)
        ledger = UsageLedger(db, "t")
        await ledger.rebuild_counters()
        await admit(ledger, key)
        await admit(ledger, key)
        with pytest.raises(BudgetExceededError, match="100002 of 100002 requests in total"):
            await admit(ledger, key)
        live, truth = await counters(db)
        assert live == truth == {(key.id, "total", 0.0): (100_002, 200_020)}
    finally:
        await db.aclose()


async def test_upgrading_a_database_with_history_builds_its_counters(db_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    from opentela.frontend.db import MIGRATIONS

    def upgrade_to(revision: str):
        def run(connection) -> None:  # type: ignore[no-untyped-def]
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)

        return run

    db = await Database.open(db_url, migrate=False)
    try:
        async with db.engine.begin() as conn:
            await conn.run_sync(upgrade_to("0001"))
        # The key as that version wrote it: without the columns later migrations added (owner_id, 0005).
        key, _ = new_key(KeySettings(budget_tokens=1000, budget_period="month"))
        old_columns = {c.key: getattr(key, c.key) for c in ApiKey.__table__.columns if c.key != "owner_id"}
        async with db.session() as s, s.begin():
            await s.execute(insert(ApiKey.__table__).values(**old_columns))
        ledger = UsageLedger(db, "t")
        async with db.session() as s, s.begin():  # two requests served by a version without counters
            for i, tokens in enumerate((30, 12)):
                await s.execute(
                    insert(UsageRow).values(
                        id=f"old{i}",
                        request_id="old",
                        key_id=key.id,
                        instance="t",
                        endpoint="/v1/completions",
                        model="m",
                        stream=False,
                        status="ok",
                        input_tokens=tokens,
                        output_tokens=0,
                        tokens_estimated=False,
                        started_at=time.time() - i,
                        day="2026-11-24",
                    )
                )
        await db.migrate()
        live, truth = await counters(db)
        assert live == truth and list(live.values()) == [(2, 42)]
        live_rate, rate_truth = await rates(db)
        assert live_rate == rate_truth and sum(r for r, _ in live_rate.values()) == 2
        adm = await admit(ledger, key, estimate=8)
        assert adm.limit_headers["x-otela-budget-remaining-tokens"] == str(1000 - 42)
    finally:
        await db.aclose()
