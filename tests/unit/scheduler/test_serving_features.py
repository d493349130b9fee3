"""Chunked prefill, the prefix cache and admission policies in the serving simulator, with their laws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ConfigError
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.prefix_cache import BLOCK_TOKENS, PrefixCache
from opentela.scheduler.roofline import step_time
from opentela.scheduler.simulator import EngineLimits, ReplicaSpec, simulate
from opentela.scheduler.step_model import StepModel
from opentela.scheduler.workload import Trace

MODEL = load_model("Qwen3-1.7B")
GPU = builtin_catalog()["H100-SXM"].with_step(
    StepModel(step_overhead_s=0.001, gemm=0.6, attention_prefill=0.4)
)

requests = st.lists(
    st.tuples(st.floats(0, 5, allow_nan=False), st.integers(1, 3000), st.integers(1, 60)),
    min_size=1,
    max_size=25,
)


def as_trace(rows: list[tuple[float, int, int]]) -> Trace:
    rows = sorted(rows)
    arrival, inp, out = (np.array(c) for c in zip(*rows, strict=True))
    return Trace(
        arrival.astype(float), inp.astype(np.int64), out.astype(np.int64), np.zeros(len(rows), dtype=np.int64)
    )


def spec(**limits: object) -> ReplicaSpec:
    return ReplicaSpec(MODEL, GPU, limits=EngineLimits(**limits))  # type: ignore[arg-type]


def shared_prefixes(trace: Trace, groups: int) -> list[tuple[str, ...]]:
    """Chained block hashes: request i shares its prompt's first blocks with the others of group i % groups."""
    out = []
    for i, n in enumerate(trace.input_len):
        blocks = int(n) // BLOCK_TOKENS
        out.append(tuple(f"g{i % groups}-b{b}" if b < blocks // 2 else f"r{i}-b{b}" for b in range(blocks)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    requests,
    st.booleans(),
    st.sampled_from([64, 512, 4096]),
    st.sampled_from(["fcfs", "spf"]),
    st.sampled_from([0.0, 0.5, 0.9]),
    st.booleans(),
    st.booleans(),
)
def test_every_prompt_token_is_computed_or_cached_once_and_every_output_token_decoded_once(
    rows: list[tuple[float, int, int]],
    chunked: bool,
    budget: int,
    policy: str,
    ratio: float,
    hashed: bool,
    slot_runs: bool,
) -> None:
    trace = as_trace(rows)
    limits = {
        "chunked_prefill": chunked,
        "max_batched_tokens": budget,
        "policy": policy,
        "slot_runs": slot_runs,
    }
    cache = {"prefix_cache_tokens": 1 << 16, "prefix_hit_ratio": ratio} if ratio or hashed else {}
    result = simulate(
        [spec(**limits, **cache)], trace, prefixes=shared_prefixes(trace, 3) if hashed else None
    )
    assert result.preemptions == 0 and result.rejected == 0
    assert np.isfinite(result.finish).all()
    assert result.prompt_computed is not None and result.prompt_cached is not None
    assert (result.prompt_computed + result.prompt_cached == trace.input_len).all()
    assert (result.prompt_computed >= 1).all()
    assert result.decoded_tokens == int(trace.output_len.sum())
    assert (result.first_token >= trace.arrival).all() and (result.finish >= result.first_token).all()


@settings(max_examples=30, deadline=None)
@given(requests, st.sampled_from(["fcfs", "spf"]))
def test_chunking_with_an_unbounded_budget_is_no_chunking(
    rows: list[tuple[float, int, int]], policy: str
) -> None:
    trace = as_trace(rows)
    budget = int(trace.input_len.sum()) + 64
    plain = simulate([spec(max_batched_tokens=budget, policy=policy)], trace)
    chunked = simulate([spec(max_batched_tokens=budget, policy=policy, chunked_prefill=True)], trace)
    assert np.array_equal(plain.first_token, chunked.first_token)
    assert np.array_equal(plain.finish, chunked.finish)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 4000), st.integers(1, 300), st.sampled_from([0.25, 0.5, 1.0]))
def test_a_prefix_hit_never_costs_more_than_a_miss(prompt: int, output: int, ratio: float) -> None:
    trace = as_trace([(0.0, prompt, output)])
    miss = simulate([spec()], trace)
    hit = simulate([spec(prefix_cache_tokens=1 << 16, prefix_hit_ratio=ratio)], trace)
    assert hit.ttft[0] <= miss.ttft[0] * (1 + 1e-12)
    assert hit.e2e[0] <= miss.e2e[0] * (1 + 1e-12)


def test_a_prompt_hits_what_an_earlier_one_left_in_the_cache() -> None:
    trace = as_trace([(0.0, 2000, 4), (5.0, 2000, 4)])
    same = [tuple(f"b{b}" for b in range(125))] * 2
    result = simulate([spec(prefix_cache_tokens=4096)], trace, prefixes=same)
    assert result.prompt_cached is not None and list(result.prompt_cached) == [0, 1999]
    assert result.ttft[1] < result.ttft[0] / 5
    # A cache too small for the prompt's blocks forgets the first ones: no leading hit.
    small = simulate([spec(prefix_cache_tokens=512)], trace, prefixes=same)
    assert small.prompt_cached is not None and list(small.prompt_cached) == [0, 0]


def test_a_chunked_prompt_takes_one_step_per_chunk_and_lets_decoders_run() -> None:
    lone = simulate([spec(chunked_prefill=True, max_batched_tokens=512)], as_trace([(0.0, 2000, 1)]))
    chunks = [512, 512, 512, 464]
    before = np.cumsum([0, *chunks[:-1]])
    expected = sum(
        step_time(MODEL, GPU, prefill=[c], cached=[int(k)]) - (0 if i == 3 else _sampling(c))
        for i, (c, k) in enumerate(zip(chunks, before, strict=True))
    )
    assert lone.ttft[0] == pytest.approx(expected, rel=1e-6)
    # A long prompt arriving while another request decodes: chunking bounds the decoder's stall.
    trace = as_trace([(0.0, 100, 400), (0.05, 8000, 2)])
    whole = simulate([spec(max_batched_tokens=8192)], trace)
    chunked = simulate([spec(max_batched_tokens=512, chunked_prefill=True)], trace)
    assert chunked.tpot[0] < whole.tpot[0]


def _sampling(chunk: int) -> float:
    # A chunk that does not finish its prompt samples nothing: step_time counts one sampled row per prompt.
    from opentela.scheduler.roofline import StepCost

    cost = StepCost(MODEL, GPU, max_tokens=chunk, max_seqs=1)
    return cost.outside_layers(chunk, 1) - cost.outside_layers(chunk, 0)


def test_shortest_prompt_first_admits_short_prompts_first() -> None:
    # The first request starts at once; the other three queue behind it.
    trace = as_trace([(0.0, 500, 2), (0.001, 3000, 2), (0.002, 100, 2), (0.003, 1000, 2)])
    fcfs = simulate([spec(max_seqs=1)], trace)
    spf = simulate([spec(max_seqs=1, policy="spf")], trace)
    assert list(np.argsort(fcfs.first_token)) == [0, 1, 2, 3]
    assert list(np.argsort(spf.first_token)) == [0, 2, 3, 1]
    assert spf.metrics()["ttft_mean"] < fcfs.metrics()["ttft_mean"]


def test_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="policy"):
        EngineLimits(policy="lifo")
    with pytest.raises(ConfigError, match="prefix_hit_ratio"):
        EngineLimits(prefix_hit_ratio=1.5)
    with pytest.raises(ConfigError, match="prefix hash lists"):
        simulate([spec()], as_trace([(0.0, 10, 2)]), prefixes=[])


def test_the_prefix_cache_is_lru_over_blocks() -> None:
    cache = PrefixCache(3)
    cache.insert(["a", "b"])
    assert cache.match(["a", "b", "c"]) == 2 and cache.peek(["c"]) == 0
    cache.insert(["x", "y"])  # evicts "a", the least recently used
    assert cache.peek(["a"]) == 0 and cache.peek(["x", "y"]) == 2 and len(cache) == 3
    assert "3 blocks" in repr(cache) and cache.hits == 1
    assert PrefixCache(0).match(["a"]) == 0


def tight_spec(**limits: object) -> ReplicaSpec:
    """A replica whose KV cache holds about 3,000 tokens, so that a busy batch preempts."""
    device = builtin_catalog()["RTX-4090"]
    roomy = ReplicaSpec(MODEL, device)
    per_token = MODEL.kv_bytes_per_token("fp16")
    share = 1 - (roomy.kv_capacity_tokens - 3000) * per_token / (device.memory_bytes * 0.9)
    return ReplicaSpec(MODEL, device, limits=EngineLimits(memory_utilization=0.9 * share, **limits))  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 2, allow_nan=False), st.integers(1, 1500), st.integers(1, 300)),
        min_size=1,
        max_size=25,
    ),
    st.booleans(),
    st.sampled_from(["fcfs", "spf"]),
)
def test_preempted_sequences_still_decode_every_output_token_once(
    rows: list[tuple[float, int, int]], chunked: bool, policy: str
) -> None:
    trace = as_trace(rows)
    spec = tight_spec(chunked_prefill=chunked, max_batched_tokens=512, policy=policy)
    assert 2900 <= spec.kv_capacity_tokens <= 3100
    result = simulate([spec], trace)
    assert result.rejected == 0 and np.isfinite(result.finish).all()
    assert result.decoded_tokens == int(trace.output_len.sum())
    assert result.prompt_computed is not None
    # Recomputation after a preemption prefills the prompt again, never less than once.
    assert (result.prompt_computed >= trace.input_len).all()
