"""Keys, limits, budgets, usage rows and reconciliation against real SQLite and PostgreSQL databases."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text

from opentela.bench.traces import CSV_COLUMNS, read_trace
from opentela.errors import AuthenticationError
from opentela.frontend.db import Database
from opentela.frontend.errors import (
    BudgetExceededError,
    KeyExpiredError,
    KeyNotFoundError,
    KeyRevokedError,
    RateLimitExceededError,
)
from opentela.frontend.keys import KeySettings, KeyStore, hash_secret
from opentela.frontend.limits import RATE_WINDOW_S
from opentela.frontend.schema import ApiKey, UsageRow
from opentela.frontend.usage import TRACE_COLUMNS, Outcome, UsageLedger


async def _admit(ledger: UsageLedger, key: ApiKey, n: int = 1, estimate: int = 10, **kw):
    out = []
    for i in range(n):
        out.append(
            await ledger.admit(
                key,
                request_id=f"r{i}",
                endpoint="/v1/chat/completions",
                model="m",
                stream=False,
                input_estimate=estimate,
                sampling={"temperature": 0.5, "max_tokens": 8},
                **kw,
            )
        )
    return out


async def test_keys_are_stored_as_hashes_and_authenticate(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        key, secret = await store.create(KeySettings(name="alice", trusted_providers=("lab-a",)))
        assert secret.startswith("otela-") and secret.startswith(key.prefix) and len(secret) > 40
        async with db.session() as s:
            stored = (await s.execute(text("SELECT prefix, secret_hash FROM api_keys"))).all()
        # Only the hash and the visible prefix are in the database, never the secret itself.
        assert stored == [(key.prefix, hash_secret(secret))]
        assert secret not in repr(stored)
        assert (await store.authenticate(secret)).id == key.id
        assert (await store.authenticate(secret)).trusted_providers == ["lab-a"]
        for bad in (None, "", "sk-abc", "otela-nope", secret + "x"):
            with pytest.raises(AuthenticationError):
                await store.authenticate(bad)
    finally:
        await db.aclose()


async def test_revoke_rotate_expire(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        key, secret = await store.create(KeySettings(name="bob"))
        rotated, new_secret = await store.rotate(key.id)
        assert rotated.id == key.id and new_secret != secret and rotated.prefix != key.prefix
        with pytest.raises(AuthenticationError, match="no such key"):
            await store.authenticate(secret)
        assert (await store.authenticate(new_secret)).id == key.id
        await store.revoke(key.id)
        await store.revoke(key.id)  # idempotent
        with pytest.raises(KeyRevokedError):
            await store.authenticate(new_secret)
        with pytest.raises(KeyRevokedError):
            await store.rotate(key.id)
        with pytest.raises(KeyNotFoundError):
            await store.revoke("nope")
        _old, old_secret = await store.create(KeySettings(name="old", expires_at=time.time() - 1))
        with pytest.raises(KeyExpiredError, match="expired"):
            await store.authenticate(old_secret)
        assert [k.name for k in await store.list()] == ["old", "bob"]
    finally:
        await db.aclose()


async def test_request_budget_refuses_with_402_and_reset_time(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(budget_requests=3, budget_period="day"))
        ledger = UsageLedger(db, "t")
        await _admit(ledger, key, 3)
        with pytest.raises(BudgetExceededError) as info:
            await _admit(ledger, key)
        err = info.value
        assert err.status_code == 402 and err.details["limit"] == "budget_requests"
        assert "3 of 3 requests this day" in err.message
        # Resets at the next UTC midnight.
        assert err.details["resets_at"] % 86400 == 0 and 0 < err.details["resets_at"] - time.time() <= 86400
    finally:
        await db.aclose()


async def test_token_budget_counts_completed_tokens(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(budget_tokens=100, budget_period="total"))
        ledger = UsageLedger(db, "t")
        (first,) = await _admit(ledger, key)
        await ledger.complete(first, Outcome("ok", 200, "p", "n", 40, 70, False))
        with pytest.raises(BudgetExceededError, match="110 of 100 tokens in total") as info:
            await _admit(ledger, key)
        assert "resets_at" not in info.value.details  # a total budget never resets
    finally:
        await db.aclose()


async def test_rate_limits_refuse_with_429_and_retry_after(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        ledger = UsageLedger(db, "t")
        key, _ = await store.create(KeySettings(rpm_limit=2))
        await _admit(ledger, key, 2)
        with pytest.raises(RateLimitExceededError) as info:
            await _admit(ledger, key)
        assert info.value.status_code == 429 and info.value.details["limit"] == "requests_per_minute"
        # Through the database a request is counted in its one-second bucket: it leaves within 60 to 61 s.
        assert 0 < info.value.details["retry_after"] <= RATE_WINDOW_S + 1
        tkey, _ = await store.create(KeySettings(tpm_limit=50))
        await _admit(ledger, tkey, 1, estimate=60)
        with pytest.raises(RateLimitExceededError, match="60 of 50 tokens per minute"):
            await _admit(ledger, tkey)
    finally:
        await db.aclose()


async def test_concurrent_admissions_never_exceed_a_limit(db_url: str) -> None:
    """Admission locks the key row, so 20 requests racing for 5 slots get exactly 5."""
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(rpm_limit=5))
        ledgers = [UsageLedger(db, "a"), UsageLedger(db, "b")]
        results = await asyncio.gather(
            *(_admit(ledgers[i % 2], key) for i in range(20)), return_exceptions=True
        )
        admitted = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, RateLimitExceededError)]
        assert len(admitted) == 5 and len(refused) == 15
    finally:
        await db.aclose()


async def test_pending_rows_are_reconciled_on_restart(db_url: str) -> None:
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings())
        mine, other = UsageLedger(db, "frontend-1"), UsageLedger(db, "frontend-2")
        (a,) = await _admit(mine, key)
        (b,) = await _admit(other, key)
        (c,) = await _admit(mine, key)
        await mine.complete(c, Outcome("ok", 200, "p", "n", 5, 6, False))
        await mine.checkpoint(a, 17, "p", "n")
        assert await mine.reconcile(stale_after=3600) == 1
        async with db.session() as s:
            rows = {r.id: r for r in (await s.scalars(select(UsageRow))).all()}
        assert rows[a.row_id].status == "interrupted" and rows[a.row_id].output_tokens == 17
        assert rows[b.row_id].status == "pending"  # another live replica's request is left alone
        assert rows[c.row_id].status == "ok"
        assert await mine.reconcile(stale_after=0) == 1  # ...unless it is older than the stale limit
    finally:
        await db.aclose()


async def test_aggregates_and_trace_export(db_url: str, tmp_path: Path) -> None:
    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        ledger = UsageLedger(db, "t")
        open_key, _ = await store.create(KeySettings(name="open"))
        private_key, _ = await store.create(KeySettings(name="private", log_content=False))
        for key, tokens in ((open_key, (3, 4)), (open_key, (5, 6)), (private_key, (7, 8))):
            (adm,) = await _admit(ledger, key)
            await ledger.complete(adm, Outcome("ok", 200, "p", "n", *tokens, False, ttft_ms=25.0))
        (failed,) = await _admit(ledger, open_key)
        await ledger.complete(failed, Outcome("error", 502, error="boom"))
        agg = {r["key_id"]: r for r in await ledger.aggregates()}
        assert agg[open_key.id]["requests"] == 3 and agg[open_key.id]["input_tokens"] == 8
        assert agg[open_key.id]["output_tokens"] == 10 and agg[open_key.id]["failed"] == 1
        assert agg[private_key.id]["requests"] == 1
        text_csv = "".join([part async for part in ledger.export_trace()])
        rows = list(csv.DictReader(io.StringIO(text_csv)))
        assert tuple(text_csv.splitlines()[0].split(",")) == TRACE_COLUMNS == CSV_COLUMNS
        # Completed requests of keys that did not opt out only; no key, no content.
        assert sorted((r["input_tokens"], r["output_tokens"]) for r in rows) == [("3", "4"), ("5", "6")]
        assert (rows[0]["temperature"], rows[0]["max_tokens"], rows[0]["top_p"]) == ("0.5", "8", "")
        assert rows[0]["ttft_s"] == "0.025" and float(rows[0]["e2e_s"]) >= 0
        assert rows[0]["prefix_hashes"] == rows[0]["reasoning"] == rows[0]["session"] == ""
        assert open_key.id not in text_csv and private_key.id not in text_csv
        # Every workload tool reads the export as it is.
        path = tmp_path / "export.csv"
        path.write_text(text_csv)
        records = read_trace(path)
        assert [(r.model, r.input_tokens, r.output_tokens) for r in records] == [("m", 3, 4), ("m", 5, 6)]
        assert all(r.temperature == 0.5 and r.max_tokens == 8 and r.ttft_s == 0.025 for r in records)
        assert records[0].timestamp == pytest.approx(time.time(), abs=60)
        series = await ledger.series(key_id=open_key.id, since=time.time() - 3600, bucket_s=300)
        assert sum(p["requests"] for p in series) == 3
    finally:
        await db.aclose()


async def test_migrations_are_idempotent_and_match_the_models(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from opentela.frontend.schema import Base

    db = await Database.open(db_url)
    await db.migrate()  # a second start applies nothing and fails nothing
    try:
        async with db.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata)
            )
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
        assert diff == [] and version == "0005"
    finally:
        await db.aclose()


async def test_limits_at_deployment_scale_and_unset_lists_are_null(db_url: str) -> None:
    """The paper's deployment metered 15 billion tokens: limits are 64-bit; an unset list is SQL NULL."""
    from opentela.errors import InvalidRequestError

    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        key, _ = await store.create(KeySettings(budget_tokens=15_000_000_000, tpm_limit=5_000_000_000))
        (adm,) = await _admit(UsageLedger(db, "t"), key)
        assert adm.limit_headers["x-otela-budget-remaining-tokens"] == "15000000000"
        with pytest.raises(InvalidRequestError, match="budget_tokens must be between"):
            await store.create(KeySettings(budget_tokens=2**63))
        async with db.session() as s:
            nulls = (
                await s.execute(
                    text("SELECT allowed_models IS NULL, trusted_providers IS NULL FROM api_keys")
                )
            ).one()
        assert tuple(nulls) == (True, True)
    finally:
        await db.aclose()


async def test_key_cache_saves_lookups_and_revocation_elsewhere_applies_within_its_bound(db_url: str) -> None:
    """Two replicas share a database: a key revoked or rotated through one stops working at once there, and at
    the other within `cache_seconds`; within the bound the other answers from memory."""
    db = await Database.open(db_url)
    try:
        here, there = KeyStore(db, cache_seconds=0.5), KeyStore(db, cache_seconds=0.5)
        key, secret = await here.create(KeySettings(name="k"))
        cached_after = (
            time.monotonic()
        )  # the cache entry is made after this, so it is fresh until at least +0.5 s
        for _ in range(20):
            assert (await there.authenticate(secret)).id == key.id
        assert there.lookups == 1
        await here.revoke(key.id)
        with pytest.raises(KeyRevokedError):
            await here.authenticate(secret)
        if time.monotonic() < cached_after + 0.4:
            await there.authenticate(secret)  # still cached: within the stated bound
        await asyncio.sleep(max(0.0, cached_after + 0.5 - time.monotonic()) + 0.6)
        with pytest.raises(KeyRevokedError):
            await there.authenticate(secret)
        other, old_secret = await here.create(KeySettings(name="r"))
        await there.authenticate(old_secret)
        _, new_secret = await here.rotate(other.id)
        with pytest.raises(AuthenticationError):
            await here.authenticate(old_secret)
        assert (await there.authenticate(new_secret)).id == other.id  # a new secret is never a stale hit
        await asyncio.sleep(1.1)
        with pytest.raises(AuthenticationError):
            await there.authenticate(old_secret)
        for _ in range(3):  # unknown secrets are looked up every time, never cached
            with pytest.raises(AuthenticationError):
                await there.authenticate("otela-made-up")
        assert "otela-made-up" not in str(there._cache)
    finally:
        await db.aclose()
