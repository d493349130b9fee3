"""`otela simulate` and `otela plan`: tables, JSON, and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opentela.cli.main import main


def test_simulate_prints_metrics_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--model", "Llama-2-13b", "--gpu", "A100-80G", "--tp", "2", "--rate", "4"]
    assert main([*argv, "--input", "600:150", "--output", "64", "--duration", "20", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = doc["metrics"]
    assert doc["tp"] == 2 and m["completed"] == m["requests"] > 0
    assert 0 < m["ttft_p50"] <= m["ttft_p99"] and 0 < m["e2e_mean"]


def test_simulate_table_and_burst_mode() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "opentela", "simulate", "--model", "Qwen3-1.7B", "--gpu", "RTX-3090",
         "--burst", "8", "--input", "512", "--output", "128"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "TTFT" in out and "TPOT" in out and "8/8 completed" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "Llama-2-13b", "--gpu", "B999"], "unknown device 'B999'"),
        (["--model", "GPT-17", "--gpu", "H100-SXM"], "unknown model 'GPT-17'"),
        (["--model", "Llama-3.3-70B-Instruct", "--gpu", "RTX-3090"], "does not fit"),
        (["--model", "Qwen3-1.7B", "--gpu", "H100-SXM", "--weights", "fp5"], "unknown dtype 'fp5'"),
    ],
)
def test_simulate_rejects_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_plan_prints_placement_and_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("devices:\n  A100-80G: 2\n  L40S: 2\n")
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        "models:\n"
        "  - {model: Qwen3-1.7B, rate: 20, input: {mean: 300, std: 50}, output: 100}\n"
        "  - {model: Llama-3.1-8B, rate: 5, input: 500, output: {mean: 100, std: 20}}\n"
    )
    argv = [
        "plan",
        "--cluster",
        str(cluster),
        "--workload",
        str(workload),
        "--sim-duration",
        "5",
        "--shares",
        "5",
        "--table-points",
        "6",
    ]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in doc["plans"]] == ["cpsat", "memp"]
    for plan in doc["plans"]:
        assert set(plan["allocation"]) == {"Qwen3-1.7B", "Llama-3.1-8B"}
        assert plan["simulated"]["overall"]["completed"] > 0
    assert doc["simulator_evaluations"] > 0
    assert main([*argv, "--baseline", "none"]) == 0
    out = capsys.readouterr().out
    assert "Placement" in out and "cpsat" in out and "memp" not in out


def test_plan_rejects_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("devices: {A100-80G: -1}\n")
    workload = tmp_path / "workload.yaml"
    workload.write_text("models: [{model: Qwen3-1.7B}]\n")
    assert main(["plan", "--cluster", str(cluster), "--workload", str(workload)]) == 2
    assert "non-negative integer" in capsys.readouterr().err
    cluster.write_text("devices: {A100-80G: 1}\n")
    assert main(["plan", "--cluster", str(cluster), "--workload", str(workload)]) == 2
    assert "needs model, rate, input and output" in capsys.readouterr().err


def test_simulate_replays_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,input,output\n0.0,100,10\n0.5,200,20\n1.0,300,30\n")
    argv = [
        "simulate",
        "--model",
        "Qwen3-1.7B",
        "--gpu",
        "L40S",
        "--trace",
        str(trace),
        "--dp",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert m["requests"] == m["completed"] == 3
    trace.write_text("arrival,input\n0.0,100\n")
    assert main(argv) == 2
    assert "each row needs arrival, input, output" in capsys.readouterr().err
