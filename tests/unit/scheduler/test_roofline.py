"""Stage 1: operator FLOPs and bytes against hand computations for a small config, and roofline times."""

from __future__ import annotations

import pytest

from opentela.scheduler.hardware import Device, builtin_catalog
from opentela.scheduler.models import ModelSpec, load_model
from opentela.scheduler.roofline import Precision, StepCost, allreduce_time, layer_operators, step_time

TINY = ModelSpec("tiny", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=100, max_positions=512)  # fmt: skip
# 1 TFLOP/s, 1 GB/s: times read straight off FLOPs and bytes.
UNIT = Device("unit", "gpu", 1.0, 1.0, {"fp16": 1.0, "int8": 2.0}, interconnect_gbs=1.0, devices_per_node=8)


def ops(**kw: object) -> dict[str, object]:
    return {op.name: op for op in layer_operators(TINY, **kw)}  # type: ignore[arg-type]


def test_projection_and_mlp_counts_match_hand_computation() -> None:
    o = ops(prefill=[8], decode=[10, 20])
    t = 8 + 2  # tokens in the step
    assert o["q_proj"].flops == 2 * t * 64 * 64
    assert o["q_proj"].bytes == 64 * 64 * 2 + t * (64 + 64) * 2
    assert o["k_proj"].flops == 2 * t * 64 * 32 and o["v_proj"].flops == 2 * t * 64 * 32
    assert o["o_proj"].flops == 2 * t * 64 * 64
    assert o["gate_proj"].flops == 2 * t * 64 * 128 and o["down_proj"].flops == 2 * t * 128 * 64
    assert o["down_proj"].bytes == 128 * 64 * 2 + t * (128 + 64) * 2
    assert "allreduce_attn" not in o


def test_attention_counts_match_hand_computation() -> None:
    o = ops(prefill=[8], decode=[10, 20])
    # Prefill, causal: QK^T and PV = 2 * n^2 * heads * head_dim; reads q,k,v and writes o and the new KV.
    assert o["attention_prefill"].flops == 2 * 8 * 8 * 4 * 16
    assert o["attention_prefill"].bytes == 8 * ((2 * 4 + 2 * 2) * 16 * 2 + 2 * 2 * 16 * 2)
    # Decode: 4 * context * heads * head_dim; reads the whole KV cache (k and v) of every sequence.
    assert o["attention_decode"].flops == 4 * 30 * 4 * 16
    assert o["attention_decode"].bytes == 2 * 30 * 2 * 16 * 2 + 2 * (2 * 4 + 2 * 2) * 16 * 2


def test_tensor_parallelism_splits_work_and_adds_allreduce() -> None:
    o = ops(decode=[10], tp=2)
    assert o["q_proj"].flops == 2 * 1 * 64 * 32
    assert o["k_proj"].flops == 2 * 1 * 64 * 16  # one of two KV heads per device
    assert o["allreduce_attn"].comm_bytes == 64 * 2 and o["allreduce_mlp"].comm_bytes == 64 * 2
    # Ring all-reduce: 2 (tp-1)/tp of the bytes over the link, plus a fixed cost per hop.
    assert allreduce_time(1e9, UNIT, 4) == pytest.approx(1.5 + 6 * 5e-6)
    # KV heads are replicated, not split below one per device.
    assert ops(decode=[10], tp=4)["k_proj"].flops == 2 * 64 * 16


def test_quantization_shrinks_bytes_and_changes_the_compute_rate() -> None:
    fp16 = ops(decode=[100])
    int8 = ops(decode=[100], precision=Precision(weights="int8", kv_cache="fp8"))
    assert int8["q_proj"].bytes - 64 * 2 * 2 * 1 == pytest.approx((fp16["q_proj"].bytes - 64 * 2 * 2) / 2)
    assert int8["q_proj"].dtype == "int8" and fp16["q_proj"].dtype == "fp16"
    assert int8["attention_decode"].bytes < fp16["attention_decode"].bytes
    # W8A8 runs at the int8 rate: half the time of fp16 when compute-bound.
    big = [
        op for op in layer_operators(TINY, prefill=[4096], precision=Precision("int8")) if op.name == "q_proj"
    ]
    fast_memory = Device("fast-memory", "gpu", 1.0, 1e6, {"fp16": 1.0, "int8": 2.0})
    assert big[0].time(fast_memory) == pytest.approx(big[0].flops / 2e12)


def test_roofline_time_is_the_slower_of_compute_and_memory() -> None:
    o = ops(decode=[10])
    q = o["q_proj"]
    assert q.time(UNIT) == pytest.approx(max(q.flops / 1e12, q.bytes / 1e9))
    assert q.time(UNIT) == pytest.approx(q.bytes / 1e9)  # one token: memory-bound


@pytest.mark.parametrize("model", ["Llama-2-13b", "Mixtral-8x7B-v0.1", "CodeLlama-34b"])
@pytest.mark.parametrize("tp", [1, 2])
def test_tabulated_step_cost_equals_the_operator_sum(model: str, tp: int) -> None:
    spec, device = load_model(model), builtin_catalog()["H100-SXM"]
    cost = StepCost(spec, device, tp, max_tokens=2048, max_seqs=64)
    for prefill, decode in (
        ([300, 200], [100, 900, 5]),
        ([], [4000] * 7),
        ([1024], []),
        ([3000], []),
    ):  # 3000 > the table
        direct = step_time(spec, device, prefill, decode, tp)
        fast = cost.time(
            sum(prefill) + len(decode), len(prefill) + len(decode), sum(decode), len(decode),
            sum(prefill), sum(n * n for n in prefill),
        )  # fmt: skip
        assert fast == pytest.approx(direct, rel=1e-9)


def test_decode_of_a_big_model_is_memory_bound_and_prefill_compute_bound() -> None:
    spec, device = load_model("Llama-2-13b"), builtin_catalog()["A100-80G"]
    decode = step_time(spec, device, decode=[1])
    assert decode == pytest.approx(spec.weight_bytes() / device.bandwidth, rel=0.05)
    prefill = step_time(spec, device, prefill=[2048])
    assert prefill == pytest.approx(2 * spec.num_params * 2048 / device.peak("fp16"), rel=0.15)
