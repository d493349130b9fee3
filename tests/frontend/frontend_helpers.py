"""Helpers of the frontend tests: the admin token, in-process frontends and `otela frontend` child processes."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from opentela.cli.localmesh import OTELA, NodeProcess, free_port
from opentela.frontend import Frontend, FrontendConfig
from opentela.frontend.counters import counters_from_rows, rate_from_rows, stored_counters, stored_rate
from opentela.frontend.db import Database
from opentela.frontend.schema import ApiKey
from opentela.frontend.usage import Admission, UsageLedger

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
