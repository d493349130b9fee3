"""One engine's life on a node: serving, and the verdicts when it never serves, dies or logs a fatal line."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

from opentela.engines.base import EngineSpec, free_port
from opentela.node._config import NodeConfig
from opentela.node.engine_runner import (
    EXIT_ENGINE_DIED,
    EXIT_ENGINE_NOT_READY,
    EXIT_FATAL_LOG_LINE,
    EngineRunner,
)
from opentela.registry.record import ModelEntry

# Answers /v1/models, prints what it is told, then exits with the given status after a while.
ENGINE = """
import http.server, json, sys, threading, time
port, line, code, after = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "m1", "max_model_len": 128}]}).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
if line: print(line, flush=True)
time.sleep(after)
sys.exit(code)
"""


def engine(line: str = "", code: int = 9, after: float = 1.0) -> EngineSpec:
    port = free_port()
    argv = [sys.executable, "-c", textwrap.dedent(ENGINE), str(port), line, str(code), str(after)]
    return EngineSpec("custom", argv, port=port)


class Verdicts:
    def __init__(self) -> None:
        self.serving: list[tuple[ModelEntry, ...]] = []
        self.fatal: list[tuple[str, int]] = []
        self.not_served: list[str] = []

    async def on_fatal(self, reason: str, code: int) -> None:
        self.fatal.append((reason, code))

    async def on_not_served(self, runner: EngineRunner, reason: str) -> None:
        self.not_served.append(reason)


def runner(
    spec: EngineSpec,
    tmp_path: Path,
    seen: Verdicts,
    *,
    assigned: bool = False,
    stop: asyncio.Event | None = None,
) -> EngineRunner:
    config = NodeConfig(ready_timeout=20, health_interval=0, stop_timeout=2)
    return EngineRunner(
        spec,
        tmp_path / "engine.log",
        config,
        stop=stop or asyncio.Event(),
        on_serving=lambda r, models: seen.serving.append(models),
        on_fatal=seen.on_fatal,
        on_not_served=seen.on_not_served if assigned else None,
    )


async def test_an_engine_that_serves_then_dies_is_exit_3(tmp_path: Path) -> None:
    seen = Verdicts()
    run = runner(engine(code=9, after=1.0), tmp_path, seen)
    assert run.key.startswith("custom:") and not run.assigned
    await asyncio.wait_for(run.run(), 30)
    assert [m.id for m in seen.serving[0]] == ["m1"] and run.models == seen.serving[0]
    assert seen.fatal == [("engine exited with code 9", EXIT_ENGINE_DIED)] and not run.ready
    await run.aclose()


async def test_an_engine_that_exits_while_the_node_stops_gives_no_verdict(tmp_path: Path) -> None:
    seen, stop = Verdicts(), asyncio.Event()
    run = runner(engine(code=0, after=0.5), tmp_path, seen, stop=stop)
    stop.set()
    await asyncio.wait_for(run.run(), 30)
    assert seen.serving and seen.fatal == []


async def test_a_fatal_log_line_is_exit_6(tmp_path: Path) -> None:
    seen = Verdicts()
    run = runner(engine(line="RuntimeError: CUDA error: an illegal memory access", after=30), tmp_path, seen)
    task = asyncio.create_task(run.run())
    try:
        for _ in range(200):
            if seen.fatal:
                break
            await asyncio.sleep(0.05)
        assert seen.fatal and seen.fatal[0][1] == EXIT_FATAL_LOG_LINE
        assert "CUDA error" in seen.fatal[0][0]
    finally:
        run.retire()
        await run.aclose()
        await asyncio.wait_for(task, 10)


async def test_an_engine_that_never_serves_fail_stops_or_sends_an_assignment_back(tmp_path: Path) -> None:
    broken = EngineSpec("custom", [sys.executable, "-c", "import sys; sys.exit(7)"], port=free_port())
    seen = Verdicts()
    await asyncio.wait_for(runner(broken, tmp_path, seen).run(), 30)
    assert len(seen.fatal) == 1 and seen.fatal[0][1] == EXIT_ENGINE_NOT_READY
    assert seen.fatal[0][0].startswith("engine not ready")
    assigned = Verdicts()
    run = runner(broken, tmp_path, assigned, assigned=True)
    await asyncio.wait_for(run.run(), 30)
    assert assigned.fatal == [] and "exit status 7" in assigned.not_served[0]
    assert not run.supervisor.running
