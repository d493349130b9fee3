"""The log sink: a fail-stop report appended to a file or POSTed to a real HTTP server, never blocking for long."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loopback_http import serve_app
from opentela.errors import ConfigError
from opentela.node.logsink import FailStopReport, LogSink, RecentLogs


def report(**changes: Any) -> FailStopReport:
    fields: dict[str, Any] = {
        "peer_id": "12D3KooWpeer",
        "session_id": "abc123",
        "provider_id": "lab",
        "hostname": "gpu-17",
        "reason": "fatal engine log line: NCCL timeout",
        "exit_code": 6,
        "engine": "vllm",
        "engine_log_path": "/logs/engine-abc.log",
        "engine_log": ["loading", "NCCL timeout"],
        "node_log": ["node joined", "fatal line"],
        "time": 0.0,
    }
    return FailStopReport(**{**fields, **changes})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def http_sink() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    async with contextlib.AsyncExitStack() as servers:

        async def serve(handler: Handler) -> str:
            app = web.Application()
            app.router.add_post("/sink", handler)
            url = await servers.enter_async_context(serve_app(app, shutdown_timeout=0.1))
            return f"{url}/sink"

        yield serve


async def test_file_sink_appends_reports_with_a_header(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "sink.log"
    sink = LogSink(str(path))
    assert await sink.ship(report())
    assert await sink.ship(report(session_id="def456", exit_code=5, reason="engine unhealthy"))
    text = path.read_text()
    assert text.splitlines()[0] == (
        "===== otela fail-stop 1970-01-01T00:00:00Z node=12D3KooWpeer session=abc123 provider=lab "
        "host=gpu-17 exit=6 ====="
    )
    assert "reason: fatal engine log line: NCCL timeout\n" in text
    assert (
        "----- engine vllm log: last 2 lines of /logs/engine-abc.log -----\nloading\nNCCL timeout\n" in text
    )
    assert "----- node log: last 2 records -----\nnode joined\nfatal line\n" in text
    assert text.count("===== otela fail-stop") == 2 and "session=def456" in text
    assert text.endswith("===== end of fail-stop report of session def456 =====\n")


async def test_file_url_is_a_path(tmp_path: Path) -> None:
    sink = LogSink(f"file://{tmp_path}/s.log")
    assert sink.path == tmp_path / "s.log" and sink.url is None


async def test_unwritable_file_sink_reports_failure_without_raising(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    assert not await LogSink(str(tmp_path / "dir")).ship(report())


async def test_http_sink_posts_the_report_as_json(http_sink: Callable[[Handler], Awaitable[str]]) -> None:
    received: list[Any] = []

    async def collect(request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        received.append(await request.json())
        return web.Response(status=204)

    sink = LogSink(await http_sink(collect))
    assert await sink.ship(report())
    assert received == [{"event": "otela.fail_stop", **report().to_json()}]


async def test_http_sink_error_status_is_a_failed_delivery(
    http_sink: Callable[[Handler], Awaitable[str]],
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500)

    assert not await LogSink(await http_sink(refuse)).ship(report())


async def test_hanging_http_sink_gives_up_after_the_timeout(
    http_sink: Callable[[Handler], Awaitable[str]],
) -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    sink = LogSink(await http_sink(hang), timeout=0.3)
    started = time.monotonic()
    assert not await sink.ship(report())
    assert time.monotonic() - started < 5  # bounded by the sink timeout, not by the server
    release.set()


async def test_unreachable_http_sink_fails_quietly() -> None:
    assert not await LogSink("http://127.0.0.1:9/nothing", timeout=2).ship(report())


@pytest.mark.parametrize("target", ["", "  ", "s3://bucket/key", "ftp://host/x"])
def test_unusable_sinks_are_configuration_errors(target: str) -> None:
    with pytest.raises(ConfigError):
        LogSink(target)


def test_recent_logs_keep_the_last_records_formatted() -> None:
    handler = RecentLogs(capacity=3)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("opentela.test.recent")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(5):
            log.warning("event %d", i)
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert handler.tail(10) == ["WARNING event 2", "WARNING event 3", "WARNING event 4"]
    assert handler.tail(1) == ["WARNING event 4"]
    assert handler.tail(0) == []
