"""One engine's life on a node: serving, and the verdicts when it never serves, dies or logs a fatal line."""

from __future__ import annotations

import asyncio
import json
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
    refreshed_models,
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


def listing(state: str, ranks: str = "0,2", **more: object) -> dict[str, object]:
    otela = {"replica_state": state, "tp_degree": len(ranks.split(",")), "tp_ranks": ranks, **more}
    return {"object": "list", "data": [{"id": "m1", "max_model_len": 128, "otela": otela}]}


def test_a_later_model_list_refreshes_settings_but_never_the_models_served() -> None:
    served = (ModelEntry("m1", "custom", {"context_length": 128}), ModelEntry("m2", "custom", {"x": 1}))
    models = refreshed_models(served, listing("reconfiguring"), {"memory_mib": 512})
    assert [m.id for m in models] == ["m1", "m2"] and models[1] is served[1]  # m2 missing: kept as it was
    assert dict(models[0].settings) == {
        "context_length": 128,
        "replica_state": "reconfiguring",
        "tp_degree": 2,
        "tp_ranks": "0,2",
        "memory_mib": 512,
    }
    assert models[0].replica_state == "reconfiguring"
    with_new = {"data": [{"id": "m3"}, {"id": "m1", "max_model_len": 128}]}
    assert [m.id for m in refreshed_models(served, with_new)] == ["m1", "m2"]
    for not_a_list in ({"status": "ok"}, [], "ok", {"data": "m1"}):
        assert refreshed_models(served, not_a_list) is served


def test_the_runner_tells_the_node_only_when_the_settings_change(tmp_path: Path) -> None:
    changes: list[tuple[str, ...]] = []
    run = EngineRunner(
        engine(),
        tmp_path / "engine.log",
        NodeConfig(),
        stop=asyncio.Event(),
        on_serving=lambda r, models: None,
        on_fatal=Verdicts().on_fatal,
        on_models=lambda r, models: changes.append(tuple(m.replica_state for m in models)),
    )
    run.models, run.ready = (ModelEntry("m1", "custom", {"context_length": 128}),), True
    reconfiguring = json.dumps(listing("reconfiguring")).encode()
    run.refresh(reconfiguring)
    run.refresh(reconfiguring)  # the same bytes: not even parsed again
    run.refresh(json.dumps(listing("reconfiguring")).encode() + b" ")  # other bytes, same settings
    run.refresh(b"OK")  # a health path that is not a model list
    assert changes == [("reconfiguring",)]
    run.refresh(json.dumps(listing("serving")).encode())
    assert changes == [("reconfiguring",), ("serving",)] and run.models[0].settings["tp_ranks"] == "0,2"
    run.retire()
    run.refresh(json.dumps(listing("reconfiguring", "0")).encode())
    assert len(changes) == 2  # a retired engine reports nothing more
