"""Calibration: fitting a step model on at most three measured steps, and the per-(device, engine) store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opentela.errors import ConfigError
from opentela.scheduler.calibration import (
    Calibration,
    StepPoint,
    calibrated_catalog,
    error_summary,
    find_calibration,
    fit_step_model,
    kind_of,
    predict,
    validation_grid,
)
from opentela.scheduler.hardware import Device, builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import Precision
from opentela.scheduler.step_model import StepModel

QWEN = load_model("Qwen3-1.7B")
H100 = builtin_catalog()["H100-SXM"]
SMOL = load_model("SmolLM2-135M-Instruct")
CPU_PRECISION = Precision(weights="q4_1", kv_cache="fp16", activations="fp32")
# The 2-core EPYC of the earlier CPU run (docs/benchmarks/simulator.md): peak from /proc/cpuinfo, copy bandwidth.
CPU = Device("host-cpu", "cpu", 32, 23.04, {"fp32": 0.1662, "bf16": 0.3323, "fp16": 0.1662, "int8": 0.6646})
# What llama.cpp measured there (prompt tokens -> best ms; batch -> p10 ms per step at 56 tokens of context).
CPU_PREFILL = {35: 104.2, 69: 219.0, 135: 411.0, 270: 875.2, 539: 1795.6, 1094: 3690.1}
CPU_DECODE = {1: 7.95, 2: 14.19, 4: 22.25, 8: 36.56}


GPU_SHAPES = (
    StepPoint(1.0, decode=(64,)),
    StepPoint(1.0, decode=(1500,) * 16),
    StepPoint(1.0, prefill=(8192,)),
)
"""The GPU recipe's three points: the smallest decode step, the one holding the most context, a long prompt."""


def measured_on(dev: Device, shapes: tuple[StepPoint, ...] = GPU_SHAPES) -> list[StepPoint]:
    """What `dev` (a device with a known step model) would measure for `shapes`."""
    return [StepPoint(predict(p, QWEN, dev), p.prefill, p.decode) for p in shapes]


def test_a_fit_recovers_the_model_that_made_the_points() -> None:
    truth = StepModel(step_overhead_s=0.004, gemm=0.55, kv_traffic=3.0)
    dev = H100.with_step(truth)
    points = measured_on(dev)
    fitted = fit_step_model(points, QWEN, H100)
    assert fitted.step_overhead_s == pytest.approx(0.004, rel=1e-3)
    assert fitted.gemm == pytest.approx(0.55, rel=1e-3)
    assert fitted.kv_traffic == pytest.approx(3.0, rel=1e-3)
    assert "prefill 8192" in fitted.source
    unseen = StepPoint(1.0, prefill=(2048,), decode=(1000,) * 8)
    assert predict(unseen, QWEN, H100.with_step(fitted)) == pytest.approx(
        predict(unseen, QWEN, dev), rel=1e-3
    )


def test_a_fit_finds_a_class_that_binds_far_below_the_others() -> None:
    # Decode attention at a tiny compute efficiency: from the usual starting points that class sits on the
    # memory side of its max(), where the fit sees no slope, and only the coarse grid of starts reaches it.
    truth = StepModel(step_overhead_s=0.004, gemm=0.55, attention_decode=0.003)
    points = measured_on(H100.with_step(truth))
    fitted = fit_step_model(points, QWEN, H100, free=("step_overhead_s", "gemm", "attention_decode"))
    assert (fitted.step_overhead_s, fitted.gemm, fitted.attention_decode) == pytest.approx(
        (0.004, 0.55, 0.003), rel=1e-3
    )


def test_a_fit_of_prompt_attention_from_two_prefills() -> None:
    truth = StepModel(step_overhead_s=0.004, gemm=0.55, attention_prefill=0.35)
    shapes = (StepPoint(1.0, decode=(64,)), StepPoint(1.0, prefill=(512,)), StepPoint(1.0, prefill=(8192,)))
    points = measured_on(H100.with_step(truth), shapes)
    fitted = fit_step_model(points, QWEN, H100, free=("step_overhead_s", "gemm", "attention_prefill"))
    assert (fitted.step_overhead_s, fitted.gemm, fitted.attention_prefill) == pytest.approx(
        (0.004, 0.55, 0.35), rel=1e-3
    )


def test_three_cpu_points_predict_the_other_seven_of_the_earlier_run() -> None:
    points = [
        StepPoint(CPU_DECODE[1] / 1e3, decode=(56,)),
        StepPoint(CPU_PREFILL[270] / 1e3, prefill=(270,)),
        StepPoint(CPU_PREFILL[1094] / 1e3, prefill=(1094,)),
    ]
    dev = CPU.with_step(fit_step_model(points, SMOL, CPU, CPU_PRECISION))
    errors = [
        predict(StepPoint(1.0, prefill=(n,)), SMOL, dev, CPU_PRECISION) * 1e3 / ms - 1
        for n, ms in CPU_PREFILL.items()
        if n not in (270, 1094)
    ]
    errors += [
        predict(StepPoint(1.0, decode=(56,) * b), SMOL, dev, CPU_PRECISION) * 1e3 / ms - 1
        for b, ms in CPU_DECODE.items()
        if b != 1
    ]
    # The single-efficiency roofline missed these by 24 % on average and 51 % at worst.
    assert np.mean(np.abs(errors)) < 0.10
    assert np.max(np.abs(errors)) < 0.20


def test_the_fit_refuses_too_many_points_or_parameters() -> None:
    point = StepPoint(0.01, decode=(10,))
    with pytest.raises(ConfigError, match="1 to 3 points"):
        fit_step_model([point] * 4, QWEN, H100)
    with pytest.raises(ConfigError, match="fit 1 to 1"):
        fit_step_model([point], QWEN, H100)
    with pytest.raises(ConfigError, match="fit"):
        fit_step_model([point], QWEN, H100, free=("gemv_rows",))
    only_overhead = fit_step_model([point], QWEN, H100, free=("step_overhead_s",))
    assert predict(point, QWEN, H100.with_step(only_overhead)) == pytest.approx(0.01, rel=1e-4)


def test_calibrations_are_stored_per_device_and_engine(tmp_path: Path) -> None:
    step = StepModel(step_overhead_s=0.003, gemm=0.6, source="test")
    cal = Calibration("H100-SXM", "vllm", step, "Qwen3-1.7B", (StepPoint(0.01, decode=(10,)),))
    path = cal.save(tmp_path)
    assert path.name == "h100-sxm--vllm.json"
    assert Calibration.load(path) == cal
    assert find_calibration(tmp_path, "H100-SXM", "vllm") == cal
    assert find_calibration(tmp_path, "H100-SXM", "sglang") is None
    catalog = calibrated_catalog(builtin_catalog(), "vllm", tmp_path)
    assert catalog["H100-SXM"].step == step
    assert catalog["A100-80G"].step == StepModel()
    (tmp_path / "broken--vllm.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read calibration"):
        Calibration.load(tmp_path / "broken--vllm.json")


def test_the_validation_grid_and_its_error_summary() -> None:
    grid = validation_grid()
    assert len(grid) == 9 + 15
    assert {kind_of(p) for p in grid} == {"prefill", "decode"}
    assert kind_of(StepPoint(1.0, prefill=(64,), cached=(1024,))) == "cached_prefill"
    assert kind_of(StepPoint(1.0, prefill=(64,), decode=(10,))) == "mixed"
    measured = [StepPoint(1.0, prefill=(16,)), StepPoint(2.0, prefill=(32,)), StepPoint(1.0, decode=(64,))]
    summary = error_summary(measured, [1.1, 1.6, 5.0], calibration=[StepPoint(9.0, decode=(64,))])
    assert summary["prefill"] == {"points": 2.0, "mean_abs_pct": 15.0, "max_abs_pct": 20.0}
    assert "decode" not in summary and summary["all"]["points"] == 2.0
