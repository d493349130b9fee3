"""GET /admin/workload on a seeded usage table, on SQLite and PostgreSQL: the statistics the seed was made to have."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import ADMIN_TOKEN, seed_usage, start_frontend, workload_rows

from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.workload import MAX_ROWS, workload

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NOWHERE = "http://127.0.0.1:9"
"""No request is forwarded in these tests: the frontend never calls its ingress."""


@pytest_asyncio.fixture
async def site(db_url: str) -> AsyncIterator[Frontend]:
    fe = await start_frontend(NOWHERE, db_url)
    try:
        yield fe
    finally:
        await fe.aclose()


async def _get(fe: Frontend, window: str, headers: dict[str, str] = ADMIN) -> tuple[int, dict]:
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.get(f"{fe.url}/admin/workload", params={"window": window}) as r:
            return r.status, await r.json()


async def test_the_workload_of_a_day_has_the_seeded_statistics(site: Frontend) -> None:
    await seed_usage(site.state.db, workload_rows(time.time()))
    status, w = await _get(site, "day")
    assert status == 200
    assert w["totals"] == {
        "requests": 25,
        "input_tokens": 20 * 60 + 5 * 1000,
        "output_tokens": 20 * 40 + 5 * 200,
    }
    assert w["analysed"] == 25 and w["truncated"] is False
    ranking = [(m["model"], m["requests"], m["tokens"]) for m in w["ranking"]["models"]]
    assert ranking == [("beta-model", 5, 6000), ("alpha-model", 20, 2000)]
    assert w["ranking"]["total_tokens"] == 8000 and w["ranking"]["top3_share"] == 1.0
    burst = {b["model"]: b for b in w["burstiness"]}
    # alpha: ten minutes of 100 tokens, then one of 1,000; its mean over 11 active minutes is 2,000 / 11.
    assert burst["alpha-model"]["magnitude"] == pytest.approx(5.5)
    assert burst["alpha-model"]["active_minutes"] == 11 and burst["alpha-model"]["peak_tpm"] == 1000
    assert burst["beta-model"]["magnitude"] == pytest.approx(1.0)
    assert [b["model"] for b in w["burstiness"]] == ["alpha-model", "beta-model"]  # most bursty first
    assert max(w["tpm"]["models"]["alpha-model"]) == 1000 and w["tpm"]["bucket_s"] == 600
    lengths = w["lengths"]["all"]
    assert (lengths["input_p50"], lengths["input_p95"], lengths["input_p99"]) == (60, 1000, 1000)
    assert (lengths["output_p50"], lengths["output_p95"]) == (40, 200) and lengths["short_output_share"] == 0
    cdf = w["lengths"]["cdf"]["all"]["input"]
    assert cdf[0] == [60, pytest.approx(1 / 25)] and cdf[-1] == [1000, 1.0]
    ratio = {m["model"]: m for m in w["output_ratio"]["models"]}
    assert ratio["alpha-model"]["overall"] == pytest.approx(0.4)
    assert ratio["beta-model"]["overall"] == pytest.approx(200 / 1200)
    # Every alpha request after the first repeats its first two blocks (32 tokens) within the hour; beta has no
    # hashes, so it is not in the reuse figures at all.
    reuse = w["prefix_reuse"]
    assert reuse["requests"] == 20 and reuse["ratio"] == pytest.approx(19 * 32 / (20 * 60))
    assert [(r["model"], r["requests"]) for r in reuse["models"]] == [("alpha-model", 20)]
    reasoning, plain = w["reasoning"]["reasoning"], w["reasoning"]["non_reasoning"]
    assert (reasoning["requests"], reasoning["e2e_p50"], reasoning["output_p50"]) == (5, 10.0, 200)
    assert (plain["requests"], plain["e2e_p95"], plain["output_p95"]) == (20, 1.0, 40)
    assert w["reasoning"]["unknown"] == 0


async def test_the_window_selects_the_rows_and_bad_requests_are_refused(site: Frontend) -> None:
    now = time.time()
    await seed_usage(site.state.db, workload_rows(now))
    _, hour = await _get(site, "hour")
    assert hour["totals"]["requests"] == 20 and [m["model"] for m in hour["ranking"]["models"]] == [
        "alpha-model"
    ]
    assert hour["tpm"]["bucket_s"] == 60 and hour["until"] - hour["since"] == 3600
    _, week = await _get(site, "week")
    assert week["totals"]["requests"] == 26 and week["reasoning"]["unknown"] == 1
    assert {m["model"] for m in week["ranking"]["models"]} == {"alpha-model", "beta-model", "gamma-model"}
    status, body = await _get(site, "month")
    assert status == 400 and body["error"]["param"] == "window"
    status, _ = await _get(site, "day", headers={"Authorization": "Bearer otela-not-the-admin"})
    assert status == 401


async def test_an_empty_window_answers_with_empty_statistics(site: Frontend) -> None:
    status, w = await _get(site, "hour")
    assert status == 200 and w["totals"]["requests"] == 0 and w["analysed"] == 0
    assert w["ranking"]["models"] == [] and w["burstiness"] == [] and w["prefix_reuse"]["ratio"] is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_window_of_100000_requests_is_analysed_in_seconds(site: Frontend) -> None:
    key, _ = await site.state.keys.create(KeySettings(name="busy"))
    now = time.time()
    # Plain tuples straight to the driver: three times faster to seed than row dictionaries.
    rows = [
        (
            f"r{i}",
            key.id,
            f"model-{i % 7}",
            100 + i % 900,
            1 + i % 300,
            now - 86_000 + i * 0.8,
            50.0 + i % 1000,
            (i % 50).to_bytes(8, "big") + i.to_bytes(8, "big"),  # 50 recurring first blocks
        )
        for i in range(MAX_ROWS)
    ]
    async with site.state.db.engine.begin() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO usage (id, request_id, key_id, instance, endpoint, model, stream, status, input_tokens, "
            "output_tokens, tokens_estimated, started_at, day, latency_ms, prefix_hashes) VALUES "
            "(?, 'r', ?, 'seed', '/v1/chat/completions', ?, 0, 'ok', ?, ?, 0, ?, '2026-01-01', ?, ?)",
            rows,
        )
    started = time.perf_counter()
    w = await workload(site.state.db, "day")
    took = time.perf_counter() - started
    assert w["analysed"] == MAX_ROWS and len(w["ranking"]["models"]) == 7
    assert w["prefix_reuse"]["requests"] > 0
    # About 0.7 s on this shared 2-core machine; the bound leaves room for a loaded one.
    assert took < 10, f"the workload of 100,000 requests took {took:.1f} s"
