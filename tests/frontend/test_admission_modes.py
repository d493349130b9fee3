"""Admission in memory (one process per SQLite file) against admission through the database, and the group-commit
writer both use: the same limits hold, the counters equal the rows, a restart continues where the last run stopped,
and the lock file keeps two processes from deciding in memory over one file."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from frontend_helpers import ADMIN_TOKEN, admit, counters, rates
from frontend_services import PostgresServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from opentela.errors import ConfigError
from opentela.frontend import Frontend, FrontendConfig
from opentela.frontend.db import Database
from opentela.frontend.errors import BudgetExceededError, RateLimitExceededError
from opentela.frontend.group_commit import COMPLETE, COMPLETION_COLUMNS, RowChange
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.schema import UsageRow
from opentela.frontend.usage import Admission, Outcome, UsageLedger

MODES = ["memory", "database"]


def ledger_for(db: Database, mode: str, instance: str = "t") -> UsageLedger:
    """A ledger admitting the given way."""
    return UsageLedger(db, instance, in_memory=mode == "memory")


async def rows(db: Database) -> dict[str, UsageRow]:
    async with db.session() as s:
        return {r.id: r for r in (await s.scalars(select(UsageRow))).all()}


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_first_requests_of_a_key_never_exceed_its_budget(tmp_path: Path, mode: str) -> None:
    """40 requests at once, the first this process sees of the key: exactly the budget's 10 get in."""
    db = await Database.open(f"sqlite:///{tmp_path}/a.db")
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="k", budget_requests=10))
        ledger = ledger_for(db, mode)
        results = await asyncio.gather(*(admit(ledger, key) for _ in range(40)), return_exceptions=True)
        admitted = [r for r in results if isinstance(r, Admission)]
        refused = [r for r in results if isinstance(r, BudgetExceededError)]
        assert len(admitted) == 10 and len(refused) == 30, results
        await asyncio.gather(
            *(ledger.complete(a, Outcome("ok", 200, input_tokens=10, output_tokens=5)) for a in admitted)
        )
        stored, truth = await counters(db)
        assert stored == truth and stored[(key.id, "month", next(iter(stored))[2])] == (10, 150)
        await ledger.aclose()
    finally:
        await db.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_a_restart_continues_the_rate_window_and_the_budget(tmp_path: Path, mode: str) -> None:
    """What the last run used counts in the next: its requests of the last minute and its tokens of the period."""
    db = await Database.open(f"sqlite:///{tmp_path}/b.db")
    try:
        rpm_key, _ = await KeyStore(db).create(KeySettings(name="rpm", rpm_limit=3))
        tok_key, _ = await KeyStore(db).create(KeySettings(name="tok", budget_tokens=100))
        first = ledger_for(db, mode)
        for _ in range(2):
            await first.complete(
                await admit(first, rpm_key), Outcome("ok", 200, input_tokens=1, output_tokens=1)
            )
        await first.complete(
            await admit(first, tok_key), Outcome("ok", 200, input_tokens=40, output_tokens=50)
        )
        await first.aclose()
        second = ledger_for(db, mode)  # a new process would start like this
        await admit(second, rpm_key)
        with pytest.raises(RateLimitExceededError):
            await admit(second, rpm_key)
        await admit(second, tok_key, estimate=10)  # 90 of 100 used before it: still under
        with pytest.raises(BudgetExceededError):
            await admit(second, tok_key)
        await second.aclose()
    finally:
        await db.aclose()


async def test_in_memory_token_counts_follow_checkpoints_and_completions(tmp_path: Path) -> None:
    """Tokens per minute: a completion's real tokens replace the estimate in the window, as with the rows."""
    db = await Database.open(f"sqlite:///{tmp_path}/c.db")
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="tpm", tpm_limit=100))
        ledger = ledger_for(db, "memory")
        adm = await admit(ledger, key, estimate=10)
        await ledger.checkpoint(adm, 30, "p", "n")
        assert adm.limit_headers["x-ratelimit-remaining-tokens"] == "90"
        await ledger.complete(adm, Outcome("ok", 200, input_tokens=10, output_tokens=95))
        with pytest.raises(RateLimitExceededError) as refused:
            await admit(ledger, key)
        assert "105 of 100" in refused.value.message
        await ledger.aclose()
    finally:
        await db.aclose()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "complete", "checkpoint"]), st.integers(0, 3), st.integers(0, 60)
        ),
        min_size=1,
        max_size=40,
    ),
    mode=st.sampled_from(MODES),
)
async def test_live_counters_equal_the_rows_after_any_sequence(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, int]], mode: str
) -> None:
    """Any interleaving of admissions, checkpoints and completions (issued concurrently, so they share commits):
    the stored counters equal the counters rebuilt from the rows, and in memory the ledger's own figures too."""
    db = await Database.open(f"sqlite:///{tmp_path_factory.mktemp('prop')}/p.db")
    try:
        store = KeyStore(db)
        keys = [
            (await store.create(KeySettings(name=f"k{i}", budget_tokens=10**9, budget_period=p)))[0]
            for i, p in enumerate(("month", "day", "total", "week"))
        ]
        ledger = ledger_for(db, mode)
        open_: list[Admission] = []
        pending: list[asyncio.Future] = []
        for op, which, tokens in steps:
            if op == "admit":
                open_.append(await admit(ledger, keys[which], estimate=tokens))
            elif open_ and op == "checkpoint":
                adm = open_[which % len(open_)]
                pending.append(asyncio.ensure_future(ledger.checkpoint(adm, tokens, "p", "n")))
            elif open_:
                adm = open_.pop(which % len(open_))
                outcome = Outcome("ok", 200, input_tokens=adm.input_estimate, output_tokens=tokens)
                pending.append(asyncio.ensure_future(ledger.complete(adm, outcome)))
        await asyncio.gather(*pending)
        await ledger.writer.flush()
        stored, truth = await counters(db)
        assert stored == truth
        stored_buckets, bucket_truth = await rates(db)
        assert stored_buckets == bucket_truth
        if ledger.local is not None:
            for (key_id, period, start), (requests, tokens) in truth.items():
                usage = ledger.local.key_usage(key_id)
                assert usage is not None and usage.budgets[(period, start)] == [requests, tokens]
        await ledger.aclose()
    finally:
        await db.aclose()


async def test_concurrent_completions_share_commits(tmp_path: Path) -> None:
    """100 requests finishing together: far fewer transactions than row changes, every row completed."""
    db = await Database.open(f"sqlite:///{tmp_path}/d.db")
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="k", budget_tokens=10**9))
        ledger = ledger_for(db, "memory")
        admitted = [await admit(ledger, key) for _ in range(100)]
        await ledger.writer.flush()
        before = ledger.writer.commits
        await asyncio.gather(
            *(
                ledger.complete(a, Outcome("ok", 200, input_tokens=10, output_tokens=i))
                for i, a in enumerate(admitted)
            )
        )
        assert ledger.writer.commits - before < 10
        stored = await rows(db)
        assert sorted(stored[a.row_id].output_tokens for a in admitted) == list(range(100))
        assert {stored[a.row_id].status for a in admitted} == {"ok"}
        await ledger.aclose()
    finally:
        await db.aclose()


async def test_the_write_ahead_log_is_checkpointed_in_the_background(tmp_path: Path) -> None:
    """The writer's own connection never checkpoints (that stalled its commits); the background checkpoints keep
    the log under 20 MiB over 1,000 requests, each its own commit, where without them it grows past 30 MiB. (It
    restarts past 8 MiB, but a restart that meets a commit waits for the next checkpoint: 14.7 MiB was seen on a
    loaded 2-core machine, so the bound leaves room for that and still tells bounded from unbounded.)"""
    db = await Database.open(f"sqlite:///{tmp_path}/w.db")
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="k", budget_tokens=10**9))
        ledger = ledger_for(db, "memory")
        largest = 0
        for i in range(1000):
            admission = await admit(ledger, key)
            await ledger.complete(admission, Outcome("ok", 200, input_tokens=10, output_tokens=i))
            largest = max(largest, (tmp_path / "w.db-wal").stat().st_size)
        assert largest < 20 * 2**20, largest
        assert ledger.writer.commits >= 1000
        await ledger.aclose()
        async with db.session() as s:
            assert len((await s.scalars(select(UsageRow))).all()) == 1000
    finally:
        await db.aclose()


async def test_a_failing_change_fails_alone_and_its_row_later_changes_with_it(tmp_path: Path) -> None:
    """A batch with an impossible insert (a row of a key that does not exist): the others commit; the completion
    of the lost row fails with the insert's error instead of counting tokens for a row that is not there."""
    db = await Database.open(f"sqlite:///{tmp_path}/e.db")
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="k", budget_tokens=10**9))
        ledger = ledger_for(db, "memory")
        good = await admit(ledger, key)
        await ledger.recorded(good)
        template = (await rows(db))[good.row_id]
        values = {c.key: getattr(template, c.key) for c in UsageRow.__table__.columns}
        writer = ledger.writer
        others = [await admit(ledger, key) for _ in range(3)]
        lost = uuid.uuid4().hex
        bad = writer.submit(
            RowChange(
                lost,
                {**values, "id": lost, "key_id": "no-such-key"},
                counter=(key.id, "month", 0.0),
                delta=(1, 5),
            )
        )
        finish = dict.fromkeys(COMPLETION_COLUMNS) | {"status": "ok", "input_tokens": 5, "output_tokens": 1}
        completion = writer.submit(
            RowChange(lost, finish, COMPLETE, counter=(key.id, "month", 0.0), delta=(0, 1))
        )
        with pytest.raises(IntegrityError):
            await bad
        for other in others:
            await ledger.recorded(other)  # committed despite the bad neighbour
        with pytest.raises(IntegrityError):
            await completion
        await ledger.complete(good, Outcome("ok", 200, input_tokens=10, output_tokens=2))
        stored, truth = await counters(db)
        assert stored == truth and (key.id, "month", 0.0) not in stored
        assert lost not in await rows(db)
        await ledger.aclose()
    finally:
        await db.aclose()


async def test_the_lock_file_keeps_in_memory_admission_to_one_process(tmp_path: Path) -> None:
    """A second frontend on the same SQLite file is refused while one admits in memory; database mode may share."""
    url = f"sqlite:///{tmp_path}/f.db"

    async def create(mode: str) -> Frontend:
        return await Frontend.create(
            FrontendConfig(admission=mode),
            db_url=url,
            admin_token=ADMIN_TOKEN,
            instance=f"i-{mode}-{time.time()}",
        )

    first = await create("auto")
    try:
        assert first.state.ledger.local is not None
        for mode in ("auto", "memory", "database"):
            with pytest.raises(ConfigError, match=r"another frontend|admitting in memory"):
                await create(mode)
    finally:
        await first.aclose()
    shared = [await create("database"), await create("database")]
    try:
        assert all(f.state.ledger.local is None for f in shared)
        with pytest.raises(ConfigError, match=r"admitting in memory|another frontend"):
            await create("memory")
    finally:
        for f in shared:
            await f.aclose()
    again = await create("memory")  # every lock was released with its frontend
    await again.aclose()
    with pytest.raises(ConfigError, match="must be one of"):
        await create("fast")


async def test_memory_admission_is_refused_on_postgresql(postgres: PostgresServer) -> None:
    """PostgreSQL may have several replicas: asking it to admit in memory is a configuration error."""
    db_url = postgres.create_database("modes_" + uuid.uuid4().hex[:8])
    with pytest.raises(ConfigError, match="needs a SQLite file"):
        await Frontend.create(
            FrontendConfig(admission="memory"), db_url=db_url, admin_token=ADMIN_TOKEN, instance="x"
        )
    frontend = await Frontend.create(FrontendConfig(), db_url=db_url, admin_token=ADMIN_TOKEN, instance="y")
    assert frontend.state.ledger.local is None
    await frontend.aclose()
