"""`otela profile` as a command: a tiny grid against a simulated engine, the file it writes, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opentela.engines.base import free_port
from opentela.engines.profile import PerformanceProfile
from opentela.engines.simulated_config import SimulatedConfig
from sim_engine_process import start_engine, stop_engine


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    proc, url = start_engine(SimulatedConfig(ttft_ms=20, itl_ms=10))
    try:
        yield url
    finally:
        stop_engine(proc)


def otela_profile(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "opentela", "profile", "--device", "cpu", "--hardware", "test-box", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


def test_a_tiny_grid_is_measured_written_and_printed(engine: str, tmp_path: Path) -> None:
    # A decode burst (64 tokens at 10 ms) takes longer than the 0.3 s budget: one length, then batch 2 stops it.
    out = otela_profile(
        *("--url", engine, "--model", "sim-model", "--max-length", "128", "--max-batch", "4"),
        *("--repeat", "1", "--max-sample-seconds", "0.3", "--json"),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    written = tmp_path / "profile-sim-model-cpu.json"
    profile = PerformanceProfile.load(written)
    assert json.loads(out.stdout) == json.loads(written.read_text())
    assert profile.hardware == "test-box" and profile.device == "cpu" and profile.source == "measured"
    assert profile.prefill_lengths == (64, 128)
    assert profile.prefill_s == pytest.approx((0.020, 0.020), abs=0.015)
    assert profile.decode_batches == (1, 2) and profile.decode_lengths == (64,)
    assert [row[0] for row in profile.decode_s] == pytest.approx([0.010, 0.010], abs=0.002)
    assert profile.meta["truncated"] is True
    progress = [line for line in out.stderr.splitlines() if line.startswith(("prefill", "decode"))]
    assert len(progress) == 4 and sum("over the budget" in line for line in progress) == 2


def test_the_summary_names_the_file(engine: str, tmp_path: Path) -> None:
    out = otela_profile(
        *("--url", engine + "/v1", "--model", "sim-model", "--max-length", "64", "--max-batch", "1"),
        *("--repeat", "1", "--out", "p.json"),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "-> p.json" in out.stdout and "B=1" in out.stdout
    assert PerformanceProfile.load(tmp_path / "p.json").decode_s[0][0] == pytest.approx(0.010, abs=0.002)


@pytest.mark.parametrize(
    ("model", "error_rate", "message"),
    [
        ("other", 0.0, "does not serve 'other'; it serves: sim-model"),
        ("sim-model", 1.0, "HTTP 500: simulated engine failure"),
    ],
)
def test_engine_errors_are_one_line_and_exit_2(
    model: str, error_rate: float, message: str, tmp_path: Path
) -> None:
    proc, url = start_engine(SimulatedConfig(error_rate=error_rate))
    try:
        out = otela_profile("--url", url, "--model", model, cwd=tmp_path)
    finally:
        stop_engine(proc)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith("otela: error: ") and message in out.stderr
    assert "Traceback" not in out.stderr and not list(tmp_path.iterdir())


def test_an_unreachable_engine_exits_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = otela_profile("--url", url, "--model", "m", cwd=tmp_path)
    assert out.returncode == 2
    assert f"otela: error: cannot reach the engine at {url}" in out.stderr and "Traceback" not in out.stderr


def test_a_profile_for_hardware_not_at_hand_comes_from_the_roofline(tmp_path: Path) -> None:
    done = otela_profile(
        "--simulate", "A100-80G", "--model", "Llama-2-7b-hf", "--out", "p.json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    profile = PerformanceProfile.load(tmp_path / "p.json")
    assert (profile.source, profile.device, profile.hardware) == ("simulated", "gpu", "gpu:A100-80G")
    assert profile.decode_time(16, 1024) > profile.decode_time(1, 1024) > 0
    assert profile.prefill_time(2048) > profile.prefill_time(256) and "simulated" in done.stdout
    unknown = otela_profile("--simulate", "TPU-v9", "--model", "Llama-2-7b-hf", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown device 'TPU-v9'" in unknown.stderr
    neither = otela_profile("--model", "m", cwd=tmp_path)
    assert neither.returncode == 2 and "--url --simulate" in neither.stderr


def test_a_simulated_profile_applies_the_stored_calibration_of_its_engine(tmp_path: Path) -> None:
    from opentela.scheduler.calibration import Calibration, StepPoint
    from opentela.scheduler.step_model import StepModel

    slow = StepModel(step_overhead_s=0.05, gemm=0.2, attention_prefill=0.5, source="test")
    point = (StepPoint(0.06, decode=(64,)),)
    Calibration("A100-80G", "sglang", slow, "Llama-2-7b-hf", point).save(tmp_path / "cal")
    args = ("--simulate", "A100-80G", "--model", "Llama-2-7b-hf", "--step-models", str(tmp_path / "cal"))
    plain = otela_profile(*args, "--out", "plain.json", cwd=tmp_path)  # vllm: no calibration stored
    calibrated = otela_profile(*args, "--engine", "sglang", "--out", "cal.json", cwd=tmp_path)
    assert plain.returncode == 0 and calibrated.returncode == 0, plain.stderr + calibrated.stderr
    before, after = (
        PerformanceProfile.load(tmp_path / "plain.json"),
        PerformanceProfile.load(tmp_path / "cal.json"),
    )
    assert "efficiency" in before.meta and after.meta["step_model"]["step_overhead_s"] == 0.05
    # Every step pays the calibrated 50 ms overhead, far above the paper setting's 3 ms.
    assert after.decode_time(1, 256) > 0.05 > before.decode_time(1, 256)
    assert after.prefill_time(2048) > before.prefill_time(2048)
