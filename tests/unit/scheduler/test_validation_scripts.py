"""The simulator's validation scripts (benchmarks/): their grids, comparisons and reports, without an engine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from opentela.scheduler.calibration import StepPoint, predict
from opentela.scheduler.hardware import builtin_catalog, host_cpu_device
from opentela.scheduler.models import spec_from_config
from opentela.scheduler.step_model import StepModel

ROOT = Path(__file__).resolve().parents[3]


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu = script("gpu_validation")
cpu = script("simulator_validation")
CPU = host_cpu_device(
    threads=2, memory_bandwidth_gbs=20.0, cpuinfo="flags : avx512f avx512_vnni\ncpu MHz : 2600"
)
TRUTH = StepModel(step_overhead_s=0.004, gemm=0.1, kv_traffic=3.0)
CPU_TRUTH = StepModel(
    gemv_rows=3,
    gemv=0.075,
    gemm=0.1,
    attention_prefill=0.3,
    attention_decode=0.04,
    ubatch_tokens=512,
    kv_pad=256,
)
"""In the family the CPU recipe fits: llama.cpp's three vector rows at 3/4 of the matrix rate, 512-token passes,
a KV view padded to 256 cells, three efficiencies."""


def test_gpu_grid_and_tiny_configs() -> None:
    assert len(gpu.grid()) == 24 and len(gpu.grid(quick=True)) == 7
    for name in gpu.MODELS:
        full = spec_from_config(gpu.shipped_config(name), name=name)
        tiny = spec_from_config(gpu.tiny_config(gpu.shipped_config(name)), name=name)
        assert full.num_layers >= 28 and tiny.num_layers == 2 and tiny.hidden_size == 64
        assert tiny.head_dim * tiny.num_heads == 64


def test_gpu_comparison_fits_three_points_and_predicts_the_rest() -> None:
    config = gpu.tiny_config(gpu.shipped_config("Qwen3-1.7B"))
    spec = spec_from_config(config, name="tiny")
    truth = CPU.with_step(TRUTH)
    points = [StepPoint(predict(p, spec, truth, gpu.PRECISION), p.prefill, p.decode) for p in gpu.grid()]
    result = gpu.compare(points, spec, CPU)
    assert sum(r["calibration_point"] for r in result["points"]) == 3
    assert result["summary"]["prefill"]["points"] == 8 and result["summary"]["decode"]["points"] == 13
    assert result["summary"]["all"]["max_abs_pct"] < 1.0


def measured_rows(spec: StepModel, device_name: str, launch_s: float) -> list[dict]:
    """The rows gpu_validation stores for the full Qwen3-1.7B grid on a catalog device with step model `spec`:
    the kernel series, and a wall clock `launch_s` slower every step (Python launching the kernels)."""
    model = spec_from_config(gpu.shipped_config("Qwen3-1.7B"), name="Qwen3-1.7B")
    device = builtin_catalog()[device_name].with_step(spec)
    rows = []
    for p in gpu.grid():
        kernels = predict(p, model, device, gpu.PRECISION)
        rows.append(
            {**StepPoint(kernels + launch_s, p.prefill, p.decode).to_dict(), "kernel_seconds": kernels}
        )
    return rows


def test_graph_replays_make_their_own_series_with_the_prompts_kernel_sums() -> None:
    # Eager decode copies its cache (kv_traffic 4); graph replays on a static cache read it once.
    eager, static = StepModel(0.003, gemm=0.4, kv_traffic=4.0), StepModel(0.003, gemm=0.4, kv_traffic=1.0)
    rows = measured_rows(eager, "H100-SXM", 0.05)
    for row, graphed in zip(rows, measured_rows(static, "H100-SXM", 0.0), strict=True):
        if row.get("decode"):
            row["graph_seconds"] = graphed["kernel_seconds"]
    doc = {
        "device": "H100-SXM",
        "torch_device": "H100",
        "tiny": False,
        "models": {"Qwen3-1.7B": {"measured": rows}},
    }
    doc = gpu.analyse(doc, builtin_catalog()["H100-SXM"], False)
    model = doc["models"]["Qwen3-1.7B"]
    assert model["graphs"]["step_model"]["kv_traffic"] == pytest.approx(1.0, rel=1e-3)
    assert model["kernels"]["step_model"]["kv_traffic"] == pytest.approx(4.0, rel=1e-3)
    assert doc["graph_summary"]["Qwen3-1.7B"]["all"]["max_abs_pct"] < 0.5
    # A run where a capture failed has no graph series.
    del rows[-1]["graph_seconds"]
    assert gpu.series(rows, "graphs") is None and gpu.series(rows, "kernels") is not None


def test_a_calibration_on_one_gpu_predicts_another_and_the_speedup(tmp_path: Path) -> None:
    # Same engine on two devices: the step model fitted on the H100's run predicts the H200's steps exactly,
    # and so every step's speedup, from the kernel series.
    truth = StepModel(step_overhead_s=0.003, gemm=0.4, kv_traffic=4.0)
    h100 = {"device": "H100-SXM", "torch_device": "H100", "tiny": False, "models": {}}
    h200 = {"device": "H200", "torch_device": "H200", "tiny": False, "models": {}}
    h100["models"]["Qwen3-1.7B"] = {"measured": measured_rows(truth, "H100-SXM", 0.05)}
    h200["models"]["Qwen3-1.7B"] = {"measured": measured_rows(truth, "H200", 0.05)}
    for run in (
        h100,
        h200,
    ):  # graph replays: the same steps, as the same engine on a static cache would run them
        for row in run["models"]["Qwen3-1.7B"]["measured"]:
            if row.get("decode"):
                row["graph_seconds"] = row["kernel_seconds"]
    doc = gpu.analyse(h200, builtin_catalog()["H200"], False, reference=h100)
    moved = doc["models"]["Qwen3-1.7B"]["transfer"]
    assert moved["series"] == "kernels" and moved["reference_device"] == "H100-SXM"
    assert moved["summary"]["all"]["max_abs_pct"] < 0.5 and moved["speedup_error"]["max_abs_pct"] < 0.5
    assert all(r["measured_speedup"] > 1.0 for r in moved["points"])
    graphs = doc["models"]["Qwen3-1.7B"]["graph_transfer"]
    assert graphs["series"] == "graphs" and graphs["speedup_error"]["max_abs_pct"] < 0.5
    assert doc["kernel_summary"]["Qwen3-1.7B"]["all"]["max_abs_pct"] < 0.5
    # The wall series (50 ms of launches more a step here) is fitted too, as its own model.
    assert doc["summary"]["Qwen3-1.7B"]["all"]["max_abs_pct"] < 0.5
    text = "\n".join(cpu.gpu_section([h200]))
    assert "### H200 (H200)" in text and "| Qwen3-1.7B | speedup (24) |" in text
    assert "Calibrated on the H100-SXM run instead" in text
    assert "calibrated on the H100-SXM run's graph replays" in text
    gpu.plot(doc, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").stat().st_size > 1000
    # Stored and read back (--reanalyse): the same figures without torch.
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(doc))
    again = gpu.analyse(json.loads(path.read_text()), builtin_catalog()["H200"], False, reference=h100)
    assert again["transfer_summary"] == doc["transfer_summary"]


def truth_rows() -> tuple[list[dict], list[dict], list[dict]]:
    """Prefill, decode and prefix-hit rows as a device with CPU_TRUTH's step model would measure them."""
    model = cpu.load_model(cpu.MODEL_NAME)
    truth = CPU.with_step(CPU_TRUTH)
    prefill = [
        {"prompt_tokens": n, "best_ms": 1000 * predict(StepPoint(1, (n,)), model, truth, cpu.PRECISION)}
        for n in cpu.PREFILL_GRID
    ]
    decode = [
        {
            "batch": b,
            "context": c,
            "best_ms": 1000 * predict(StepPoint(1, (), (c,) * b), model, truth, cpu.PRECISION),
        }
        for c in (80, 530, 1520)
        for b in cpu.DECODE_BATCHES
    ]
    hits = [
        {
            "cached": k,
            "new": n,
            "best_ms": 1000 * predict(StepPoint(1, (n,), (), (k,)), model, truth, cpu.PRECISION),
        }
        for k, n in cpu.PREFIX_CHECKS
    ]
    return prefill, decode, hits


def test_cpu_validation_compares_reports_and_plots(tmp_path: Path) -> None:
    prefill, decode, hits = truth_rows()
    points = cpu.as_points(prefill, decode, hits)
    device, chosen, rows = cpu.compare(points, CPU)
    # The smallest decode step, the one holding the most context, the prefill at the grid's geometric middle.
    assert [(c.prefill, len(c.decode), sum(c.decode)) for c in chosen] == [
        ((), 1, 80),
        ((), 16, 16 * 1520),
        ((2048,), 0, 0),
    ]
    assert max(abs(r["error_pct"]) for r in rows) < 1.0
    assert device.step.gemv_rows == 3 and abs(device.step.gemv_efficiency / 0.075 - 1) < 0.01
    summary = cpu.error_summary(points, [r["predicted_ms"] / 1000 for r in rows], chosen)
    assert summary["cached_prefill"]["points"] == 3
    trace = cpu.mixed_trace(8, rate=0.5, seed=1)
    simulated = cpu.simulate_mixed(trace, device)
    assert 0 < simulated["tpot_ms"]["p50"] < simulated["ttft_ms"]["p90"] * 10
    fake = {"p50": 100.0, "p90": 150.0, "p99": 200.0}
    doc = {
        "engine": "test",
        "device": {
            "source": "test",
            "cores": 2,
            "peak_tops": {"int8": 0.6},
            "measured_copy_bandwidth_gbs": 20.0,
        },
        "step_model": device.step.to_dict(),
        "calibration_points": [c.to_dict() for c in chosen],
        "fitted": ["gemm", "attention_prefill", "attention_decode"],
        "points": rows,
        "summary": summary,
        "mixed": {
            "requests": 8,
            "rate_rps": 0.5,
            "measured": {"ttft_ms": fake, "tpot_ms": fake},
            "simulated": simulated,
            "ttft_ms_p50_error_pct": 1.0,
            "tpot_ms_p50_error_pct": -2.0,
        },
        "gpu_speedups": [],
        "repeats": 3,
        "loadavg_before": [0.5, 0.5, 0.5],
        "loadavg_after": [0.6, 0.6, 0.6],
    }
    text = cpu.markdown(doc)
    assert "prefill 2048 (calibration)" in text and "| cached_prefill (3) |" in text
    assert "decode 16 x 1520 ctx, prefill 2048), fitting gemm, attention_prefill, attention_decode" in text
    assert "has not been run on a GPU yet" in text
    doc["gpu"] = {"device": "H100-SXM", "torch_device": "H100", "summary": {"Qwen3-1.7B": summary}}
    assert "| Qwen3-1.7B | decode (13) |" in cpu.markdown(doc)
    cpu.plot(doc, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_the_gpu_script_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_validation.py"), "--tiny", "--device", "cpu"]
    subprocess.run([*cmd, "--quick", "--repeats", "1", "--out", str(out)], check=True, timeout=300)
    assert out.stat().st_size > 0


def test_paced_points_scale_each_measurement_to_the_runs_median_pace() -> None:
    fast, slow = {"prefill_ms": 10.0, "decode_ms": 5.0}, {"prefill_ms": 20.0, "decode_ms": 10.0}
    reference = cpu.median_pace([fast, fast, slow])
    assert reference == fast
    # The second run of a prompt came while the machine ran at half speed: scaled, it equals the first.
    prefill = [
        {
            "prompt_tokens": 64,
            "best_ms": 8.0,
            "median_ms": 12.0,
            "runs_ms": [8.0, 16.0],
            "paces": [[fast, fast], [slow, slow]],
        }
    ]
    # A decode cell bracketed by a normal and a slow pace: 1.5x slower on average.
    decode = [{"batch": 2, "context": 100, "best_ms": 30.0, "median_ms": 33.0, "paces": [[fast, slow]]}]
    hits: list[dict] = []
    raw = cpu.as_points(prefill, decode, hits, "best_ms")
    paced = cpu.as_points(prefill, decode, hits, "best_ms", reference)
    paced_median = cpu.as_points(prefill, decode, hits, "median_ms", reference)
    assert [p.seconds for p in raw] == [0.008, 0.030]
    assert [p.seconds for p in paced] == pytest.approx([0.008, 0.020])
    assert [p.seconds for p in paced_median] == pytest.approx([0.008, 0.022])
    measured = {"ttft_ms": {"p50": 100.0}, "tpot_ms": {"p50": 30.0}}
    scaled = cpu.paced_mixed(measured, [fast, slow], reference)
    assert scaled["ttft_ms"]["p50"] == pytest.approx(100 / 1.5) and scaled["tpot_ms"]["p50"] == pytest.approx(
        20.0
    )


def test_the_report_shows_every_statistic_of_the_same_run() -> None:
    prefill, decode, hits = truth_rows()
    exact = [p.to_dict() for p in cpu.as_points(prefill, decode, hits)]
    # The medians: one predicted prefill measured 40 % slow, so that statistic misses the worst-error target.
    slow = [dict(r) for r in prefill]
    slow[3]["best_ms"] *= 1.4
    off = [p.to_dict() for p in cpu.as_points(slow, decode, hits)]
    raw = {
        "threads": 2,
        "measured_copy_bandwidth_gbs": 20.0,
        "points": exact,
        "points_median": off,
        "mixed": {"requests": 8, "rate_rps": 0.5, "seed": 1},
    }
    device, _, _ = cpu.compare([StepPoint.from_dict(p) for p in exact], CPU)
    simulated = cpu.simulate_mixed(cpu.mixed_trace(8, rate=0.5, seed=1), device)
    raw["mixed"]["measured"] = {m: {"p50": simulated[m]["p50"]} for m in ("ttft_ms", "tpot_ms")}
    # Nothing paced was recorded: two rows, one of them the report's own analysis, taken as it is.
    rows = cpu.every_statistic(raw, cpu.analyse(raw, "median", False))
    assert [(r["statistic"], r["paced"]) for r in rows] == [("best", False), ("median", False)]
    assert rows[0]["targets_held"] == 6 and abs(rows[0]["ttft_ms"]) < 1e-6
    assert rows[1]["prefill_worst"] > 20 and rows[1]["targets_held"] < 6
    table = "\n".join(cpu.statistics_table(rows, ("median", False)))
    assert "| best | " in table and "| **median** (above) |" in table and "| 6 of 6 |" in table
