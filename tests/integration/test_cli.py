"""The command line as a user runs it: version, the demo, status."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opentela.cli.localmesh import free_port
from opentela.engines.embedded import MODEL_ID

pytestmark = pytest.mark.integration


def otela(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opentela", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_version() -> None:
    out = otela("version")
    assert out.returncode == 0 and out.stdout.startswith("otela ")


def test_demo_once_answers_and_names_the_node(tmp_path) -> None:
    out = otela("demo", "--once", "--http", f"127.0.0.1:{free_port()}", "--dir", str(tmp_path), timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "A: " in out.stdout and "served by node 12D3KooW" in out.stdout
    assert "paris" in out.stdout.lower()
    assert MODEL_ID in out.stderr
    # The answer came through the API frontend with the demo's first key, and was metered.
    assert (
        "metered for key otela-" in out.stdout and " output tokens (dashboard http://127.0.0.1:" in out.stdout
    )


def test_start_rejects_engine_command_and_shorthand_together() -> None:
    out = otela("start", "--engine", "embedded", "--", "vllm", "serve", "x")
    assert out.returncode == 2 and "not both" in out.stderr


def test_status_of_unreachable_ingress_is_a_clear_error() -> None:
    out = otela("status", "--ingress", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 2 and "cannot read the mesh" in out.stderr
