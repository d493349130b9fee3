"""The step model: per-step overhead and per-operator-class efficiencies, in step_time and the tabulated cost."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ConfigError
from opentela.scheduler.hardware import builtin_catalog, parse_devices
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import Precision, StepCost, layer_operators, step_time
from opentela.scheduler.step_model import StepModel

MODEL = load_model("Qwen3-1.7B")
H100 = builtin_catalog()["H100-SXM"]
SKEWED = StepModel(
    step_overhead_s=0.002,
    gemm=0.6,
    gemv=0.2,
    attention_prefill=0.4,
    attention_decode=0.3,
    elementwise=0.5,
    memory=0.8,
    kv_traffic=3.0,
)


def test_the_identity_is_the_pure_roofline() -> None:
    assert StepModel().is_identity
    for op in layer_operators(MODEL, prefill=[300], decode=[100, 200]):
        if op.comm_bytes:
            continue
        pure = max(op.flops / H100.peak(op.dtype), op.bytes / H100.bandwidth)
        assert op.time(H100) == pytest.approx(pure)


def test_kv_traffic_multiplies_the_cache_bytes_decode_attention_moves() -> None:
    plain = next(op for op in layer_operators(MODEL, decode=[1000, 3000]) if op.kind == "attention_decode")
    copied = next(
        op
        for op in layer_operators(MODEL, decode=[1000, 3000], view=StepModel(kv_traffic=3.0))
        if op.kind == "attention_decode"
    )
    per_seq = 2 * (2 * MODEL.num_heads + 2 * MODEL.num_kv_heads) * MODEL.head_dim * 2  # q, k, v, o in fp16
    cache = plain.bytes - per_seq
    assert copied.bytes - per_seq == pytest.approx(3 * cache)
    assert copied.flops == plain.flops
    # Traffic, not an efficiency: a device with more bandwidth runs the long-context decode step faster.
    h200 = builtin_catalog()["H200"]
    long = {"decode": [4000] * 16}
    model = StepModel(kv_traffic=4.0)
    speedup = step_time(MODEL, H100.with_step(model), **long) / step_time(
        MODEL, h200.with_step(model), **long
    )
    assert speedup == pytest.approx(h200.bandwidth / H100.bandwidth, rel=0.02)


def test_the_overhead_is_paid_once_per_step() -> None:
    slow = H100.with_step(StepModel(step_overhead_s=0.005))
    for batch in ({"prefill": [500]}, {"decode": [100] * 8}, {"prefill": [40, 60], "decode": [10]}):
        expected = step_time(MODEL, H100, **batch) + 0.005  # type: ignore[arg-type]
        assert step_time(MODEL, slow, **batch) == pytest.approx(expected)  # type: ignore[arg-type]
    assert step_time(MODEL, slow) == step_time(MODEL, H100)  # no sequence, no step


def test_class_efficiencies_slow_their_own_operators_only() -> None:
    slow_attention = H100.with_step(StepModel(attention_prefill=0.25))
    ops = {op.name: op for op in layer_operators(MODEL, prefill=[4096])}
    assert ops["attention_prefill"].time(slow_attention) > 3.9 * ops["attention_prefill"].time(H100)
    assert ops["q_proj"].time(slow_attention) == ops["q_proj"].time(H100)


def test_decode_shaped_products_run_at_the_gemv_rate_and_stay_monotone() -> None:
    dev = H100.with_step(StepModel(gemm=0.8, gemv=0.01, gemv_rows=16))
    times = [step_time(MODEL, dev, prefill=[t]) for t in range(1, 80)]
    assert all(a <= b for a, b in itertools.pairwise(times))
    # At 16 rows the products are compute-bound at the gemv rate: much slower than under the gemm rate alone.
    assert step_time(MODEL, dev, decode=[10] * 16) > 2 * step_time(
        MODEL, H100.with_step(StepModel(gemm=0.8)), decode=[10] * 16
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_the_table_matches_the_operator_sum_under_a_step_model(tp: int) -> None:
    dev = H100.with_step(SKEWED)
    cost = StepCost(MODEL, dev, tp, max_tokens=4096, max_seqs=64)
    prefill, cached, decode = [300, 17], [0, 128], [50, 900, 4]
    n = np.array(prefill)
    k = np.array(cached)
    table = cost.time(
        int(n.sum()) + len(decode),
        len(prefill) + len(decode),
        float(sum(decode)),
        len(decode),
        float(n.sum()),
        float(np.sum(n * n + 2 * n * k)),
        float(k.sum()),
    )
    direct = step_time(MODEL, dev, prefill, decode, tp, cached=cached)
    assert table == pytest.approx(direct, rel=1e-9)
    ctx = np.array([100.0, 5000.0])
    assert cost.decode_times(3, ctx) == pytest.approx(
        [step_time(MODEL, dev, decode=[c / 3] * 3, tp=tp) for c in ctx], rel=1e-9
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4000), st.integers(0, 4000), st.sampled_from([None, SKEWED]))
def test_a_cached_prefix_never_costs_more_than_computing_it(n: int, h: int, step: StepModel | None) -> None:
    h = min(h, n - 1)
    dev = H100 if step is None else H100.with_step(step)
    with_hit = step_time(MODEL, dev, prefill=[n - h], cached=[h])
    assert with_hit <= step_time(MODEL, dev, prefill=[n]) * (1 + 1e-12)


def test_round_trip_and_validation() -> None:
    assert StepModel.from_dict(SKEWED.to_dict()) == SKEWED
    with pytest.raises(ConfigError, match="unknown fields"):
        StepModel.from_dict({"gem": 0.5})
    with pytest.raises(ConfigError, match="positive"):
        StepModel(gemm=0.0)
    with pytest.raises(ConfigError, match="cannot fit"):
        StepModel().with_values({"gemv_rows": 3})


def test_a_hardware_file_may_carry_a_step_model() -> None:
    text = """
my-gpu:
  memory_gib: 24
  memory_bandwidth_gbs: 1000
  tflops: {fp16: 100}
  step: {step_overhead_s: 0.003, gemm: 0.7}
"""
    dev = parse_devices(text)["my-gpu"]
    assert dev.step == StepModel(step_overhead_s=0.003, gemm=0.7)
    assert step_time(MODEL, dev, decode=[10]) > 0.003
    assert Precision().compute == "fp16"
