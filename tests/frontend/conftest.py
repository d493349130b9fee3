"""Fixtures of the frontend tests: real SQLite and PostgreSQL databases, a real mesh, frontends, Chromium."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from frontend_services import INSTALL_TIMES, PostgresServer, Unavailable, ensure_chromium, postgres_server

from loopback_http import serve_app
from opentela.cli.localmesh import LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID


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


@pytest_asyncio.fixture
async def recording_ingress() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in ingress that records request headers and answers a fixed chat completion."""
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        reply = {
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        return web.json_response(
            reply, headers={"X-Otela-Provider": "lab-a", "X-Otela-Node": "12D3KooWstandin"}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serve_app(app) as url:
        yield url, seen
