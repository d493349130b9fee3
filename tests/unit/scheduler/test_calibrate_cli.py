"""`otela simulate calibrate` from a profile file; `otela simulate` with the stored step model and a trace's
prefix hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opentela.bench.traces import TraceRecord, write_trace
from opentela.cli.main import main
from opentela.engines.profile import PerformanceProfile
from opentela.engines.simulated_config import SimulatedConfig
from opentela.scheduler.calibration import StepPoint, choose_points, predict, profile_points
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.step_model import StepModel
from sim_engine_process import start_engine, stop_engine

MODEL = load_model("Qwen3-1.7B")
TRUTH = builtin_catalog()["H100-SXM"].with_step(StepModel(step_overhead_s=0.006, gemm=0.5, kv_traffic=3.0))


def truth_profile() -> PerformanceProfile:
    lengths = (64, 128, 256, 512, 1024, 2048)
    batches = (1, 4)
    return PerformanceProfile(
        model=MODEL.name,
        hardware="gpu:H100",
        device="gpu",
        prefill_lengths=lengths,
        prefill_s=tuple(predict(StepPoint(1.0, prefill=(n,)), MODEL, TRUTH) for n in lengths),
        decode_batches=batches,
        decode_lengths=lengths,
        decode_s=tuple(
            tuple(predict(StepPoint(1.0, decode=(n,) * b), MODEL, TRUTH) for n in lengths) for b in batches
        ),
    )


def test_points_come_from_a_profile_and_three_are_chosen() -> None:
    points = profile_points(truth_profile())
    assert len(points) == 6 + 12
    chosen = choose_points(points)
    # The shortest decode step, the decode step holding the most context, the longest prompt.
    assert [p.prefill or (len(p.decode), p.decode[0]) for p in chosen] == [(1, 64), (4, 2048), (2048,)]


def test_calibrate_stores_a_step_model_that_simulate_then_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    truth_profile().save(profile)
    store = tmp_path / "store"
    common = ["--model", "Qwen3-1.7B", "--gpu", "H100-SXM", "--engine", "vllm", "--step-models", str(store)]
    assert main(["simulate", "calibrate", "--profile", str(profile), *common]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert Path(doc["stored"]) == store / "h100-sxm--vllm.json"
    assert doc["step_model"]["step_overhead_s"] == pytest.approx(0.006, rel=1e-3)
    assert doc["max_abs_error_pct"] < 0.5 and len(doc["check_points"]) == 15
    argv = ["simulate", *common, "--burst", "4", "--input", "512", "--output", "16", "--json"]
    assert (
        main([*argv, "--chunked-prefill", "--prefix-hit-ratio", "0.5", "--prefix-cache-tokens", "1000"]) == 0
    )
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["step_model"]["gemm"] == pytest.approx(0.5, rel=1e-3)
    assert main([*argv[:-1], "--engine", "sglang", "--json"]) == 0
    pure = json.loads(capsys.readouterr().out)
    assert pure["step_model"] is None
    assert calibrated["metrics"]["e2e_mean"] > pure["metrics"]["e2e_mean"]


def test_calibrate_needs_a_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "calibrate", "--model", "Qwen3-1.7B", "--gpu", "H100-SXM"]) == 2
    assert "--url or --profile" in capsys.readouterr().err
    assert main(["simulate", "--gpu", "H100-SXM"]) == 2
    assert "needs --model and --gpu" in capsys.readouterr().err


def test_simulate_feeds_a_traces_prefix_hashes_to_the_prefix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Twenty turns of one conversation: each prompt extends the previous one's 1600 tokens by 16.
    records = [
        TraceRecord(
            2.0 * i,
            "Qwen3-1.7B",
            1600 + 16 * i,
            8,
            prefix_hashes=tuple(f"b{b}" for b in range(100 + i)),
        )
        for i in range(20)
    ]
    trace = tmp_path / "trace.jsonl"
    write_trace(records, trace)
    argv = ["simulate", "--model", "Qwen3-1.7B", "--gpu", "RTX-4090", "--trace", str(trace), "--json"]
    argv += ["--step-models", str(tmp_path / "none")]
    assert main(argv) == 0
    cold = json.loads(capsys.readouterr().out)["metrics"]["ttft_mean"]
    assert main([*argv, "--prefix-cache-tokens", "65536"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metrics"]["ttft_mean"] < cold / 3
    assert doc["prompt_tokens_cached_share"] > 0.9


def test_calibrate_measures_an_engine_at_a_url_on_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The simulated engine (a simulator, standing in for a GPU engine): decode gets slower with every other
    # sequence decoding, so the GPU recipe's decode step holding the most context is one of many sequences.
    proc, url = start_engine(SimulatedConfig(ttft_ms=8.0, itl_ms=4.0, itl_per_active_ms=0.5))
    try:
        argv = ["simulate", "calibrate", "--url", url + "/v1", "--served-model", "sim-model"]
        argv += ["--model", "Qwen3-1.7B", "--gpu", "H100-SXM", "--engine", "vllm", "--max-length", "128"]
        assert main([*argv, "--step-models", str(tmp_path)]) == 0
    finally:
        stop_engine(proc)
    doc = json.loads(capsys.readouterr().out)
    assert doc["fitted"] == ["step_overhead_s", "gemm", "kv_traffic"]
    small, most, prompt = doc["calibration_points"]
    assert len(small["decode"]) == 1 and len(most["decode"]) == 16 and prompt["prefill"] == [128]
    assert Path(doc["stored"]).exists() and doc["mean_abs_error_pct"] is not None
