"""The node reads what its engine runs with: command line first, then the engine's answers, never crashing on them."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from opentela.engines.base import EngineSpec, free_port
from opentela.node import engine_settings as settings_module
from opentela.node._config import NodeConfig
from opentela.node.engine_runner import EngineRunner
from opentela.node.engine_settings import engine_settings, fetch_reports
from opentela.registry.record import ModelEntry

Handler = Callable[[web.Request], Any]


async def serve(routes: dict[str, Handler]) -> AsyncIterator[int]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def answer(body: Any, status: int = 200) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(text=text, status=status, content_type="application/json")

    return handle


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(settings_module.REPORT_TIMEOUT_S + 1)
    return web.Response()


def vllm_spec(port: int, *flags: str) -> EngineSpec:
    return EngineSpec("vllm", ("vllm", "serve", "m", "--port", str(port), *flags), port=port)


async def test_the_command_line_wins_and_a_disagreement_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async for port in serve({"/version": answer({"version": "0.8.5"})}):
        spec = vllm_spec(port, "--quantization", "awq", "--max-model-len", "4096", "-tp", "2")
        with caplog.at_level(logging.WARNING, logger="opentela.node.engine_settings"):
            got = await engine_settings(spec, [{"id": "m", "max_model_len": 8192}])
    assert got == {
        "quantization": "awq",
        "tensor_parallel_size": 2,
        "context_length": 4096,
        "engine_version": "0.8.5",
    }
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "context_length=4096" in warned[0] and "8192" in warned[0]


@pytest.mark.parametrize(
    "handler",
    [
        answer({"error": "x"}, 500),
        answer("{not json"),
        answer([1, 2]),
        answer({"version": {"nested": 1}}),
        hang,
    ],
)
async def test_odd_or_silent_engines_leave_only_the_command_line(handler: Handler) -> None:
    async for port in serve({"/version": handler}):
        spec = vllm_spec(port, "--dtype", "bfloat16")
        started = time.monotonic()
        got = await engine_settings(spec, [{"id": "m", "max_model_len": "lots"}])
        assert time.monotonic() - started < settings_module.REPORT_TIMEOUT_S + 2
    assert got == {"dtype": "bf16"}


async def test_nothing_is_read_from_a_port_that_does_not_answer() -> None:
    assert await fetch_reports(f"http://127.0.0.1:{free_port()}", ("/props",), timeout=1) == {}
    assert await engine_settings(EngineSpec("no-such-adapter", ("x",), port=free_port()), []) == {}


async def test_an_adapter_that_raises_only_advertises_less(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        report_paths = ()

        def launch_settings(self, argv: Any) -> dict[str, Any]:
            raise RuntimeError("plugin bug")

    monkeypatch.setattr(settings_module, "engine_adapter", lambda name: Broken())
    assert await engine_settings(vllm_spec(free_port()), [{"id": "m"}]) == {}


# A stand-in for `vllm serve`: its command carries vLLM's flags, it answers /v1/models and /version.
FAKE_VLLM = """
import http.server, json, sys
port = int(sys.argv[1])
answers = {"/v1/models": {"data": [{"id": "m1", "max_model_len": 4096}]}, "/version": {"version": "0.9.0"}}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(answers.get(self.path, {})).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


async def test_a_serving_engine_announces_its_settings(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", textwrap.dedent(FAKE_VLLM), str(port), "--quantization", "gptq_marlin"]
    served: list[tuple[ModelEntry, ...]] = []
    serving = asyncio.Event()

    def announced(runner: EngineRunner, models: tuple[ModelEntry, ...]) -> None:
        served.append(models)
        serving.set()

    async def fatal(reason: str, code: int) -> None:
        pass

    runner = EngineRunner(
        EngineSpec("vllm", tuple(argv), port=port),
        tmp_path / "engine.log",
        NodeConfig(ready_timeout=20, health_interval=0, stop_timeout=2),
        stop=asyncio.Event(),
        on_serving=announced,
        on_fatal=fatal,
    )
    runner.memory_mib = 512
    task = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(serving.wait(), 20)
    finally:
        await runner.aclose()
        await task
    (entry,) = served[0]
    assert dict(entry.settings) == {
        "context_length": 4096,
        "quantization": "gptq",
        "engine_version": "0.9.0",
        "memory_mib": 512,
    }
