"""Fixtures of the frontend tests: real SQLite and PostgreSQL databases, a real mesh, frontends, Chromium."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from frontend_services import INSTALL_TIMES, PostgresServer, Unavailable, ensure_chromium, postgres_server

from opentela.engines.embedded import MODEL_ID
from opentela.frontend import Frontend, FrontendConfig
from opentela.localmesh import OTELA, LocalMesh, NodeProcess, embedded_engine_argv, free_port

ADMIN_TOKEN = "otela-admin-test-" + uuid.uuid4().hex


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report how long installing and starting the real services took."""
    if INSTALL_TIMES:
        terminalreporter.write_sep("-", "frontend test services")
        for what, seconds in INSTALL_TIMES.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session (installed by apt when missing); skipped only where it cannot run."""
    try:
        with postgres_server() as server:
            yield server
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL cannot run here: {exc}")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'frontend.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database("t_" + uuid.uuid4().hex[:16])


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium (installed by apt when missing)."""
    try:
        return ensure_chromium()
    except Unavailable as exc:
        pytest.skip(f"headless Chromium cannot run here: {exc}")


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """The demo's mesh: an ingress and two workers with the real embedded SmolLM2 engine (one thread each)."""
    async with LocalMesh(tmp_path_factory.mktemp("frontend-mesh")) as m:
        await m.start_ingress()
        await m.add_worker("worker-1", embedded_engine_argv(threads=1), provider="demo-provider-1")
        await m.add_worker("worker-2", embedded_engine_argv(threads=1), provider="demo-provider-2")
        await m.wait_serving(MODEL_ID, 2, timeout=120)
        yield m


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

    def __init__(self, ingress: str, db_url: str, workdir: Path, name: str = "frontend") -> None:
        self.port = free_port()
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
        env = {**os.environ, "OTELA_FRONTEND_INSTANCE": f"{name}-{self.port}", "PYTHONUNBUFFERED": "1"}
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
