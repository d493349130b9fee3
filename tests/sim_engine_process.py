"""The simulated engine as a child process, for tests that need a real engine URL without a mesh."""

from __future__ import annotations

import subprocess
import sys

from opentela.engines.base import free_port
from opentela.engines.simulated_config import SimulatedConfig

SIMULATED_TEMPLATE = [
    sys.executable,
    "-m",
    "opentela",
    "engine",
    "simulated",
    "--port",
    "{port}",
    "--model",
    "{model}",
]
"""The simulated engine as a command template, as a controller's catalog or an assignment names it."""


def start_engine(config: SimulatedConfig) -> tuple[subprocess.Popen[str], str]:
    """A simulated engine in its own process on a free port, once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "opentela", "engine", "simulated", "--port", str(port), *config.to_argv()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, f"http://127.0.0.1:{port}"


def stop_engine(proc: subprocess.Popen[str]) -> None:
    """Terminate it (kill after 10 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
