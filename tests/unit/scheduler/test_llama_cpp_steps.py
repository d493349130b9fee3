"""How llama.cpp runs a step: micro-batches, a padded KV view, the output projection's own format, the slot
runs of its server, and the calibration tie of prompt attention to the matrix products."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ConfigError
from opentela.scheduler.calibration import (
    CPU_FREE,
    StepPoint,
    choose_points,
    fit_step_model,
    predict,
    recipe,
)
from opentela.scheduler.hardware import host_cpu_device
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import Precision, StepCost, layer_operators, prompt_pairs, step_time
from opentela.scheduler.simulator import EngineLimits, ReplicaSpec, _Replica, simulate
from opentela.scheduler.step_model import StepModel
from opentela.scheduler.workload import Trace

SMOL = load_model("SmolLM2-135M-Instruct")
CPU = host_cpu_device(threads=1, memory_bandwidth_gbs=20.0, cpuinfo="flags : avx2\ncpu MHz : 2450")
GGUF = Precision(weights="q4_1", kv_cache="fp16", activations="fp32", head="q8_0")
LLAMA = StepModel(gemm=0.13, gemv=0.09, gemv_rows=3, attention_prefill=0.27, attention_decode=0.07)


def test_passes_split_a_step_into_micro_batches() -> None:
    step = StepModel(ubatch_tokens=512)
    assert step.passes(300) == [300]
    assert step.passes(1025) == [512, 512, 1]
    assert StepModel().passes(5000) == [5000]
    assert step.kv_cells(700) == 700
    assert StepModel(kv_pad=256).kv_cells(np.array([1.0, 256.0, 257.0])).tolist() == [256.0, 256.0, 512.0]
    with pytest.raises(ConfigError, match="ubatch_tokens"):
        StepModel(ubatch_tokens=-1)


def test_a_long_prompt_costs_its_passes() -> None:
    whole = CPU.with_step(LLAMA)
    split = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512}))
    # Attention is the same either way; the token-wise operators are paid pass by pass.
    assert step_time(SMOL, split, [512], precision=GGUF) == step_time(SMOL, whole, [512], precision=GGUF)
    assert step_time(SMOL, split, [2048], precision=GGUF) == pytest.approx(
        step_time(SMOL, whole, [2048], precision=GGUF), rel=0.05
    )
    with_rest = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512, "gemv_rows": 16}))
    # A one-token last pass runs at the vector rate: more than the same token inside a big pass.
    assert step_time(SMOL, with_rest, [1025], precision=GGUF) > step_time(
        SMOL, CPU.with_step(StepModel(**{**LLAMA.to_dict(), "gemv_rows": 16})), [1025], precision=GGUF
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 3000), st.sampled_from([0, 512]))
def test_a_padded_view_never_computes_fewer_pairs_than_causal_attention(n: int, k: int, ubatch: int) -> None:
    padded = prompt_pairs(n, k, StepModel(kv_pad=256, ubatch_tokens=ubatch))
    assert padded >= prompt_pairs(n, k) - 1e-9
    assert padded <= n * (((n + k + 255) // 256) * 256)
    assert prompt_pairs(n + 1, k, StepModel(kv_pad=256, ubatch_tokens=ubatch)) > padded


def test_the_output_projection_has_its_own_format_and_efficiency() -> None:
    ops = {op.name: op for op in layer_operators(SMOL, [16], precision=GGUF)}
    q4 = ops["q_proj"].bytes
    from opentela.scheduler.roofline import model_operators

    head = next(op for op in model_operators(SMOL, 1, 1, precision=GGUF) if op.name == "lm_head")
    assert head.kind == "lm_head"
    assert head.bytes > SMOL.vocab_size * SMOL.hidden_size  # Q8_0: more than a byte a weight
    assert q4 < SMOL.hidden_size * SMOL.hidden_size  # Q4_1: under a byte
    fast_head = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "head": 1.0}))
    assert step_time(SMOL, fast_head, decode=[100], precision=GGUF) < step_time(
        SMOL, CPU.with_step(LLAMA), decode=[100], precision=GGUF
    )
    assert StepModel.from_dict({"head": 0.5, "ubatch_tokens": 512, "kv_pad": 256}).kv_pad == 256


@pytest.mark.parametrize("extra", [{}, {"ubatch_tokens": 512}, {"head": 0.4, "ubatch_tokens": 64}])
def test_the_table_matches_the_operator_sum(extra: dict) -> None:
    dev = CPU.with_step(StepModel(**{**LLAMA.to_dict(), **extra}))
    cost = StepCost(SMOL, dev, precision=GGUF, max_tokens=2048, max_seqs=16)
    for prefill, cached, decode in (([300], [0], [50, 900]), ([1500], [64], []), ([], [], [10] * 5)):
        n, k = np.array(prefill, dtype=float), np.array(cached, dtype=float)
        table = cost.time(
            int(n.sum()) + len(decode),
            len(prefill) + len(decode),
            float(sum(decode)),
            len(decode),
            float(n.sum()),
            sum(cost.prompt_n2(int(a), int(b)) for a, b in zip(n, k, strict=True)),
            float(k.sum()),
        )
        direct = step_time(SMOL, dev, prefill, decode, precision=GGUF, cached=cached)
        assert table == pytest.approx(direct, rel=1e-9)


def test_a_padded_view_pads_prompts_and_leaves_decoders_alone() -> None:
    plain = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512}))
    dev = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "kv_pad": 256, "ubatch_tokens": 512}))
    cost = StepCost(SMOL, dev, precision=GGUF, max_tokens=2048, max_seqs=16)
    n2 = cost.prompt_n2(700, 100)
    assert n2 == 2 * (512 * 768 + 188 * 1024)  # a pass of 512 over 768 cells, then 188 over 1024
    assert cost.time(700, 1, 0.0, 0, 700.0, n2, 100.0) == pytest.approx(
        step_time(SMOL, dev, [700], precision=GGUF, cached=[100]), rel=1e-9
    )
    assert step_time(SMOL, dev, [700], precision=GGUF) > step_time(SMOL, plain, [700], precision=GGUF)
    # A decoding sequence's single query skips the masked cells: padding changes nothing there.
    assert step_time(SMOL, dev, decode=[300] * 4, precision=GGUF) == step_time(
        SMOL, plain, decode=[300] * 4, precision=GGUF
    )
    assert cost.decode_times(4, np.array([1200.0]))[0] == pytest.approx(
        step_time(SMOL, dev, decode=[300] * 4, precision=GGUF), rel=1e-9
    )


def test_the_llama_cpp_recipe_ties_the_vector_rows_and_fits_three_efficiencies() -> None:
    truth = StepModel(
        gemm=0.12, gemv=0.09, gemv_rows=3, attention_prefill=0.2, attention_decode=0.06, kv_pad=256
    )
    dev = CPU.with_step(StepModel(**{**truth.to_dict(), "ubatch_tokens": 512}))
    grid = [StepPoint(1.0, decode=(80,) * b) for b in (1, 2, 4, 16)]
    grid += [
        StepPoint(1.0, decode=(1500,) * 16),
        StepPoint(1.0, prefill=(256,)),
        StepPoint(1.0, prefill=(2048,)),
    ]
    points = [StepPoint(predict(p, SMOL, dev, GGUF), p.prefill, p.decode) for p in grid]
    free, base = recipe("cpu", "embedded")
    assert base is not None and base.gemv_tie == 0.75 and free == CPU_FREE
    chosen = choose_points(points)
    assert [(p.prefill, len(p.decode)) for p in chosen] == [((), 1), ((), 16), ((2048,), 0)]
    assert chosen[1].decode[0] == 1500
    fitted = fit_step_model(chosen, SMOL, CPU, GGUF, free=free, base=base)
    assert fitted.gemv == pytest.approx(0.75 * fitted.gemm)
    for p in chosen:
        assert predict(p, SMOL, CPU.with_step(fitted), GGUF) == pytest.approx(p.seconds, rel=1e-3)
    # A group of four rows costs what three single rows do: only the fourth sequence's attention is added.
    step = CPU.with_step(fitted)
    one, three, four = (step_time(SMOL, step, decode=[10] * b, precision=GGUF) for b in (1, 3, 4))
    assert three == pytest.approx(3 * one, rel=1e-3)
    assert three < four < three + one / 4


def _replica(**limits: object) -> _Replica:
    spec = ReplicaSpec(
        SMOL,
        CPU.with_step(StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512})),
        precision=GGUF,
        limits=EngineLimits(max_seqs=16, max_batched_tokens=2048, chunked_prefill=True, **limits),  # type: ignore[arg-type]
    )
    return _Replica(spec, np.zeros(8, dtype=np.int64), np.zeros(8, dtype=np.int64))


def test_a_step_runs_one_micro_batch_per_run_of_consecutive_slots() -> None:
    replica = _replica(slot_runs=True)
    replica.slot_of = {0: 0, 1: 1, 2: 2, 3: 5, 4: 6, 5: 9}
    decoders = [(rid, 1, True) for rid in range(4)]
    assert replica._passes(decoders) == [(3, 3), (1, 1)]
    # A prompt chunk joins its run with one token; the rest runs alone, in passes of at most 512, sampled last.
    assert replica._passes([*decoders, (4, 1200, True)]) == [(3, 3), (2, 1), (512, 0), (512, 0), (175, 1)]
    assert replica._passes([(5, 40, False)]) == [(1, 0), (39, 0)]


def test_scattered_slots_make_decoding_dearer_and_every_token_still_counts() -> None:
    rng = np.random.default_rng(3)
    n = 40
    trace = Trace(
        np.sort(rng.uniform(0, 60, n)),
        rng.integers(32, 400, n),
        rng.integers(8, 48, n),
        np.zeros(n, dtype=np.int64),
    )
    dev = CPU.with_step(StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512}))
    results = []
    for runs in (False, True):
        limits = EngineLimits(max_seqs=16, max_batched_tokens=2048, chunked_prefill=True, slot_runs=runs)
        results.append(simulate([ReplicaSpec(SMOL, dev, precision=GGUF, limits=limits)], trace))
    plain, runs = results
    assert runs.decoded_tokens == plain.decoded_tokens == int(trace.output_len.sum())
    assert np.nanmedian(runs.tpot) >= np.nanmedian(plain.tpot)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 3000), st.integers(1, 2999))
def test_a_prefix_hit_costs_at_most_a_miss_and_one_pad_block_per_new_token(n: int, h: int) -> None:
    h = min(h, n - 1)
    step = StepModel(**{**LLAMA.to_dict(), "ubatch_tokens": 512, "kv_pad": 256})
    dev = CPU.with_step(step)
    hit = step_time(SMOL, dev, [n - h], precision=GGUF, cached=[h])
    miss = step_time(SMOL, dev, [n], precision=GGUF)
    # Passes start at other positions after a hit, so a pass may see one more pad block of the view than the
    # same tokens did in the miss (llama.cpp pads each pass's view): never more than that.
    per_pair = (
        4 * SMOL.num_heads * SMOL.head_dim * SMOL.num_layers / (CPU.peak("fp32") * step.attention_prefill)
    )
    assert hit <= miss + (n - h) * step.kv_pad * per_pair
    if n <= 512 or h % 512 == 0:  # the same pass boundaries: a hit is never dearer
        assert hit <= miss * (1 + 1e-12)
