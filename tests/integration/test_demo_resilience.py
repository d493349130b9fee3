"""`otela demo` as a user leaves it running: a worker that dies is named and restarted while the rest of the mesh
keeps answering, and only SIGTERM (or Ctrl-C) ends the demo."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from opentela.cli.localmesh import free_port
from opentela.engines.embedded import MODEL_ID

pytestmark = pytest.mark.integration


def _wait(check: Callable[[], object], timeout: float, what: str, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}; the demo said:\n{log.read_text()[-3000:]}")


def _post(url: str, body: dict, key: str) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _serving(ingress: str) -> int:
    try:
        with urllib.request.urlopen(ingress + "/v1/models", timeout=5) as r:
            listing = json.load(r)
    except (OSError, ValueError):
        return 0
    model = next((m for m in listing["data"] if m["id"] == MODEL_ID), {"replicas": []})
    return sum(1 for r in model["replicas"] if r["state"] == "SERVING" and not r["suspected"])


def test_the_demo_outlives_a_dead_worker_and_restarts_it(tmp_path: Path) -> None:
    http_port, frontend_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    argv = [sys.executable, "-m", "opentela", "demo", "--http", f"127.0.0.1:{http_port}"]
    argv += [
        "--frontend-http",
        f"127.0.0.1:{frontend_port}",
        "--dir",
        str(tmp_path / "demo"),
        "--threads",
        "1",
    ]
    with open(log, "wb") as out:
        demo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    family: list[psutil.Process] = []
    try:
        _wait(lambda: "Press Ctrl-C to stop" in log.read_text(), 180, "the demo to come up", log)
        match = re.search(r"First API key \(shown once\): (otela-\S+)", log.read_text())
        assert match, log.read_text()
        key = match.group(1)
        family = psutil.Process(demo.pid).children(recursive=True)
        worker = next(p for p in family if any(a.endswith("worker-1.key") for a in p.cmdline()))
        os.killpg(worker.pid, signal.SIGKILL)  # the node and its engine, as when their machine goes

        _wait(lambda: "restarting worker-1" in log.read_text(), 30, "the demo to restart worker-1", log)
        text = log.read_text()
        assert "worker-1 (provider demo-provider-1) exited (-9); 1 worker(s) still serving" in text
        assert demo.poll() is None, text[-3000:]
        chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        api = f"http://127.0.0.1:{frontend_port}/v1/chat/completions"
        _wait(lambda: _post(api, chat, key) == 200, 60, "an answer from the workers left", log)
        _wait(
            lambda: _serving(f"http://127.0.0.1:{http_port}") == 2, 150, "the restarted worker to serve", log
        )
        assert demo.poll() is None

        family = psutil.Process(demo.pid).children(recursive=True)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if demo.poll() is None:
            family = [*family, *psutil.Process(demo.pid).children(recursive=True)]
            demo.kill()
            demo.wait()
        for child in family:  # workers run in their own sessions: reap whatever is left
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
