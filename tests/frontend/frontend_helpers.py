"""Helpers of the frontend tests: the admin token, in-process frontends and `otela frontend` child processes."""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import insert

from opentela.cli.localmesh import OTELA, NodeProcess, free_port
from opentela.frontend import Frontend, FrontendConfig
from opentela.frontend.counters import counters_from_rows, rate_from_rows, stored_counters, stored_rate
from opentela.frontend.db import Database
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.schema import ApiKey, UsageRow
from opentela.frontend.usage import Admission, UsageLedger, utc_day

ADMIN_TOKEN = "otela-admin-test-" + uuid.uuid4().hex


async def admit(ledger: UsageLedger, key: ApiKey, estimate: int = 10) -> Admission:
    """Admit one chat request of `key` with `estimate` prompt tokens."""
    return await ledger.admit(
        key,
        request_id=f"r-{uuid.uuid4().hex[:8]}",
        endpoint="/v1/chat/completions",
        model="m",
        stream=False,
        input_estimate=estimate,
        sampling=None,
    )


async def counters(db: Database) -> tuple[dict, dict]:
    """Every budget counter as stored, and as the usage rows say it should be."""
    async with db.engine.connect() as conn:
        return await conn.run_sync(stored_counters), await conn.run_sync(counters_from_rows)


async def rates(db: Database) -> tuple[dict, dict]:
    """Every rate bucket in the window, as stored and as the usage rows say it should be (at one instant)."""
    now = time.time()
    async with db.engine.connect() as conn:
        return await conn.run_sync(stored_rate, now), await conn.run_sync(rate_from_rows, now)


async def seed_usage(db: Database, rows: Iterable[dict[str, Any]]) -> str:
    """Insert usage rows of a new key straight into the table, completed as the ledger leaves them; each row gives
    at least `model`, `started_at`, `input_tokens` and `output_tokens`. Returns the key's id."""
    key, _ = await KeyStore(db).create(KeySettings(name="seeded"))
    full = []
    for row in rows:
        started = row["started_at"]
        full.append(
            {
                "id": uuid.uuid4().hex,
                "request_id": "seeded",
                "key_id": key.id,
                "instance": "seed",
                "endpoint": "/v1/chat/completions",
                "stream": False,
                "status": "ok",
                "tokens_estimated": False,
                "day": utc_day(started),
                "finished_at": started + (row.get("latency_ms") or 0) / 1000,
                "latency_ms": None,
                "reasoning": None,
                "prefix_hashes": None,
                **row,
            }
        )
    async with db.engine.begin() as conn:
        for start in range(0, len(full), 20_000):
            await conn.execute(insert(UsageRow), full[start : start + 20_000])
    return key.id


def workload_rows(now: float) -> list[dict[str, Any]]:
    """A usage table with known workload statistics (tests/frontend/test_workload.py states them).

    alpha-model: 10 requests a minute apart, then 10 within one minute (tokens per minute 100, then 1,000: a
    burst of 5.5x its mean over 11 active minutes), each 60 prompt + 40 output tokens, 1 s, not reasoning, all
    sharing their first two prefix blocks. beta-model: 5 requests, 5 h ago, 1,000 + 200 tokens, 10 s, reasoning.
    gamma-model: one request 3 days ago (only in the week). Failed requests are never counted.
    """
    base = math.floor((now - 40 * 60) / 60) * 60 + 1.0
    shared = "a1a1a1a1a1a1a1a1b2b2b2b2b2b2b2b2"
    alpha = [base + 60 * i for i in range(10)] + [base + 600 + i for i in range(10)]
    rows = [
        {
            "model": "alpha-model",
            "started_at": t,
            "input_tokens": 60,
            "output_tokens": 40,
            "latency_ms": 1000.0,
            "reasoning": False,
            "prefix_hashes": bytes.fromhex(shared + uuid.uuid4().hex),  # two shared blocks, two of its own
        }
        for t in alpha
    ]
    rows += [
        {
            "model": "beta-model",
            "started_at": now - 5 * 3600 + 120 * i,
            "input_tokens": 1000,
            "output_tokens": 200,
            "latency_ms": 10_000.0,
            "reasoning": True,
        }
        for i in range(5)
    ]
    rows.append(
        {"model": "gamma-model", "started_at": now - 3 * 86400, "input_tokens": 5, "output_tokens": 5}
    )
    rows.append(
        {
            "model": "alpha-model",
            "started_at": now - 60,
            "input_tokens": 9999,
            "output_tokens": 0,
            "status": "error",
        }
    )
    return rows


async def start_frontend(ingress: str, db_url: str, **config: Any) -> Frontend:
    """An in-process frontend on a free port."""
    fc = FrontendConfig(ingress=ingress, **config)
    frontend = await Frontend.create(
        fc, db_url=db_url, admin_token=ADMIN_TOKEN, instance=f"test-{uuid.uuid4().hex[:6]}"
    )
    await frontend.start("127.0.0.1", 0)
    return frontend


class FrontendProcess:
    """`otela frontend` as a child process (what an operator runs), killable with SIGKILL."""

    def __init__(
        self, ingress: str, db_url: str, workdir: Path, name: str = "frontend", port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            *OTELA,
            "frontend",
            "--ingress",
            ingress,
            "--db",
            db_url,
            "--http",
            f"127.0.0.1:{self.port}",
            "--admin-token",
            ADMIN_TOKEN,
        ]
        env = {**os.environ, "OTELA_FRONTEND_INSTANCE": name, "PYTHONUNBUFFERED": "1"}
        self.node = NodeProcess(name, argv, workdir / f"{name}-{self.port}.log", env)

    async def start(self, timeout: float = 60) -> FrontendProcess:
        """Spawn and wait until it answers."""
        await self.node.start()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.node.exited() is not None:
                    raise RuntimeError(
                        f"otela frontend exited ({self.node.exited()}):\n{self.node.log_tail()}"
                    )
                try:
                    async with http.get(self.url + "/api/info") as r:
                        if r.status == 200:
                            return self
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"otela frontend did not answer within {timeout} s:\n{self.node.log_tail()}")

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        await self.node.stop()
