"""The supervisor spawns engines in their own process group, detects readiness and crashes, and stops them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from opentela.engines.base import EngineSpec, free_port
from opentela.engines.simulated import CRASH_EXIT_CODE
from opentela.errors import EngineCrashedError, UpstreamTimeout
from opentela.node.supervisor import EngineSupervisor

SIMULATED = "import sys; from opentela.engines.simulated import main; main(sys.argv[1:])"


def python_spec(code: str, port: int | None = None, **kw: object) -> EngineSpec:
    return EngineSpec("custom", [sys.executable, "-c", textwrap.dedent(code)], port=port or free_port(), **kw)


def simulated_spec(*flags: str) -> EngineSpec:
    port = free_port()
    argv = [sys.executable, "-c", SIMULATED, "--port", str(port), "--model", "sup-model", *flags]
    return EngineSpec("simulated", argv, port=port, ready_timeout=30)


def reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_ready_with_simulated_engine_then_clean_stop(tmp_path: Path) -> None:
    sup = EngineSupervisor(simulated_spec(), tmp_path / "engine.log", poll_interval=0.05)
    await sup.start()
    try:
        models = await sup.wait_ready()
        assert [m["id"] for m in models] == ["sup-model"]
        assert sup.running and sup.pid is not None
        assert os.getpgid(sup.pid) == sup.pid  # leads its own process group
    finally:
        code = await sup.stop(timeout=10)
    assert code == 0  # SIGTERM is a clean stop for the engine
    assert not sup.running and sup.returncode == 0
    assert sup.pid is not None and reaped(sup.pid)
    log = (tmp_path / "engine.log").read_text()
    assert "otela starting engine simulated" in log
    assert "listening on http://127.0.0.1:" in log


async def test_wait_exit_reports_an_engine_that_dies_after_ready(tmp_path: Path) -> None:
    async with EngineSupervisor(simulated_spec("--crash-after", "0"), tmp_path / "e.log") as sup:
        await sup.wait_ready()
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                req = {"messages": [{"role": "user", "content": "hi"}]}
                async with http.post(sup.spec.base_url + "/v1/chat/completions", json=req) as resp:
                    await resp.read()
        assert await asyncio.wait_for(sup.wait_exit(), 10) == CRASH_EXIT_CODE
        assert "simulated crash" in sup.log_tail()


async def test_command_that_exits_at_once_raises_crashed_with_log_tail(tmp_path: Path) -> None:
    spec = python_spec("import sys; print('boom: unknown flag --frobnicate', flush=True); sys.exit(3)")
    sup = EngineSupervisor(spec, tmp_path / "e.log", ready_timeout=30, poll_interval=0.05)
    await sup.start()
    t0 = time.monotonic()
    with pytest.raises(EngineCrashedError) as info:
        await sup.wait_ready()
    assert time.monotonic() - t0 < 5
    assert "boom: unknown flag --frobnicate" in str(info.value)
    assert "exit status 3" in str(info.value)
    assert await sup.stop() == 3


async def test_missing_executable_raises_crashed(tmp_path: Path) -> None:
    spec = EngineSpec("custom", ["/nonexistent/otela-test-engine"], port=free_port())
    with pytest.raises(EngineCrashedError, match="could not start"):
        await EngineSupervisor(spec, tmp_path / "e.log").start()
    assert "could not start the engine" in (tmp_path / "e.log").read_text()


async def test_port_already_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        spec = python_spec("pass", port=sock.getsockname()[1])
        with pytest.raises(EngineCrashedError, match="already listens"):
            await EngineSupervisor(spec, tmp_path / "e.log").start()


async def test_not_ready_in_time_raises_upstream_timeout(tmp_path: Path) -> None:
    spec = python_spec("import time; print('loading weights', flush=True); time.sleep(60)")
    sup = EngineSupervisor(spec, tmp_path / "e.log", ready_timeout=0.5, poll_interval=0.05)
    await sup.start()
    try:
        with pytest.raises(UpstreamTimeout) as info:
            await sup.wait_ready()
        assert "loading weights" in str(info.value)
        assert sup.running
    finally:
        assert await sup.stop(timeout=5) == -signal.SIGTERM


async def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    # The engine forks a worker; both ignore SIGTERM, as a wedged engine might.
    child_pid_file = tmp_path / "child.pid"
    spec = python_spec(
        f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code])
        open({str(child_pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """
    )
    sup = EngineSupervisor(spec, tmp_path / "e.log", poll_interval=0.05)
    await sup.start()
    try:
        for _ in range(200):
            if child_pid_file.exists() and child_pid_file.read_text():
                break
            await asyncio.sleep(0.05)
        child_pid = int(child_pid_file.read_text())
    finally:
        t0 = time.monotonic()
        code = await sup.stop(timeout=0.5)
    assert 0.4 < time.monotonic() - t0 < 5
    assert code == -signal.SIGKILL
    assert sup.pid is not None and reaped(sup.pid)
    for _ in range(100):  # the worker was reparented; init reaps it shortly after the kill
        if not alive(child_pid):
            break
        await asyncio.sleep(0.05)
    assert not alive(child_pid)


async def test_log_is_appended_and_tail_covers_this_run_only(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "engine.log"
    first = EngineSupervisor(python_spec("print('first run line')"), log)
    await first.start()
    assert await first.wait_exit() == 0
    await first.stop()
    second = EngineSupervisor(
        python_spec("import sys; print('out line'); print('err line', file=sys.stderr)"), log
    )
    await second.start()
    assert await second.wait_exit() == 0
    await second.stop()
    text = log.read_text()
    assert text.index("first run line") < text.index("out line")
    assert "err line" in text  # stderr goes to the same file
    tail = second.log_tail()
    assert "out line" in tail and "err line" in tail and "first run line" not in tail
    assert second.log_tail(1) == tail.splitlines()[-1]


def test_engine_dies_with_a_killed_node(tmp_path: Path) -> None:
    # A "node" process supervises a sleeping engine and is then SIGKILLed, as Slurm would do.
    pid_file = tmp_path / "engine.pid"
    node_code = textwrap.dedent(
        f"""
        import asyncio, sys, time
        from opentela.engines.base import EngineSpec, free_port
        from opentela.node.supervisor import EngineSupervisor

        async def main():
            argv = [sys.executable, "-c", "import time; time.sleep(60)"]
            spec = EngineSpec("custom", argv, port=free_port())
            sup = EngineSupervisor(spec, {str(tmp_path / "e.log")!r})
            await sup.start()
            open({str(pid_file)!r}, "w").write(str(sup.pid))
            await asyncio.sleep(60)

        asyncio.run(main())
        """
    )
    node = subprocess.Popen([sys.executable, "-c", node_code])
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        engine_pid = int(pid_file.read_text())
        assert alive(engine_pid)
    finally:
        node.kill()
        node.wait(timeout=10)
    deadline = time.monotonic() + 5
    while alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(engine_pid)
