"""The synthetic trace has the shape it was fitted to: the analysis recovers the generator's parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opentela.bench import trace_analysis as ta
from opentela.bench.trace_synthetic import (
    DEFAULT_MODELS,
    FIGURE_MODELS,
    ModelSpec,
    SyntheticParams,
    fit,
    synthetic_trace,
)
from opentela.bench.traces import PREFIX_BLOCK_TOKENS, TraceRecord

PAPER = SyntheticParams()
SPEC = {m.name: m for m in DEFAULT_MODELS}


@pytest.fixture(scope="module")
def trace() -> list[TraceRecord]:
    return synthetic_trace(seed=1, n_requests=30_000, days=30)


@pytest.fixture(scope="module")
def analysis(trace: list[TraceRecord]) -> ta.TraceAnalysis:
    return ta.analyze(trace, ta.FigureModels(**FIGURE_MODELS))


def test_the_trace_is_well_formed_and_seeded(trace: list[TraceRecord]) -> None:
    assert len(trace) == 30_000
    times = [r.timestamp for r in trace]
    assert times == sorted(times)
    assert PAPER.start_unix <= times[0] and times[-1] < PAPER.start_unix + 31 * ta.DAY_S
    assert {r.model for r in trace} == set(SPEC)
    for r in trace[:2000]:
        assert len(r.prefix_hashes) == -(-r.input_tokens // PREFIX_BLOCK_TOKENS)
        assert r.reasoning == SPEC[r.model].reasoning
        assert r.e2e_s is not None and r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.max_tokens is None or r.output_tokens <= r.max_tokens
    again = synthetic_trace(seed=1, n_requests=300, days=3)
    assert again == synthetic_trace(seed=1, n_requests=300, days=3)
    assert again != synthetic_trace(seed=2, n_requests=300, days=3)


def test_token_shares_and_tiers(analysis: ta.TraceAnalysis) -> None:
    ranking = analysis.ranking
    share = {m.model: m.share for m in ranking.models}
    assert ranking.tiers == (3, 7, 12)
    assert [m.model for m in ranking.models[:3]] == [m.name for m in DEFAULT_MODELS[:3]]
    assert ranking.top3_share == pytest.approx(sum(m.token_share for m in DEFAULT_MODELS[:3]), abs=0.03)
    for spec in DEFAULT_MODELS[:10]:
        if spec.prefix_reuse > 0.5:
            continue  # a few long sessions make the thinking model's share vary from trace to trace
        tolerance = 0.08 if spec in DEFAULT_MODELS[:3] else 0.2
        assert share[spec.name] == pytest.approx(spec.token_share, rel=tolerance), spec.name
    assert ranking.slope < -1


def test_burstiness_in_the_papers_range(analysis: ta.TraceAnalysis) -> None:
    top15 = [b.magnitude for b in analysis.burstiness[:15]]
    # Paper: among the 15 most bursty models the lowest exceeds 13 and the highest is over 80.
    assert min(top15) > 5 and 50 < max(top15) < 150


def test_output_lengths(analysis: ta.TraceAnalysis) -> None:
    r, n = analysis.reasoning, analysis.non_reasoning
    assert r.output_p50 == pytest.approx(PAPER.reasoning_output_p50, rel=0.1)
    assert r.output_p95 == pytest.approx(PAPER.reasoning_output_p95, rel=0.2)
    assert n.output_p50 == pytest.approx(PAPER.non_reasoning_output_p50, rel=0.1)
    assert n.output_p95 == pytest.approx(PAPER.non_reasoning_output_p95, rel=0.1)
    by_model = {s.model: s for s in analysis.model_lengths}
    for name in ("Llama-3.1-70B-Instruct", "Llama-3.3-70B-Instruct", "Qwen3-32B"):
        assert by_model[name].short_output_share == pytest.approx(SPEC[name].short_output_share, abs=0.03)
    distill = by_model["DeepSeek-R1-Distill-Llama-70B"]
    assert distill.input_p50 == pytest.approx(SPEC[distill.model].long_prompt_tokens, rel=0.05)
    assert 100 <= analysis.lengths.input_p50 <= 1000  # most prompts are 10^2-10^3 tokens


def test_latency_is_fitted_to_the_published_p95(analysis: ta.TraceAnalysis) -> None:
    assert analysis.reasoning.e2e_p95 == pytest.approx(PAPER.reasoning_e2e_p95_s)
    assert analysis.non_reasoning.e2e_p95 == pytest.approx(PAPER.non_reasoning_e2e_p95_s)


def test_output_ratio_drifts_where_asked(trace: list[TraceRecord]) -> None:
    drifting = ta.output_ratio(trace, "Qwen3-32B")
    steady = ta.output_ratio(trace, "Apertus-70B-Instruct")
    assert drifting.ratio.std() > 2 * steady.ratio.std()


def test_reuse_recovers_the_sessions_as_built(trace: list[TraceRecord]) -> None:
    """A later turn repeats the previous prompt's full blocks: the analysis finds exactly those."""
    got = ta.reused_tokens(trace)
    last: dict[str, int] = {}
    for r, reused in zip(trace, got.tolist(), strict=True):
        expected = 0
        if r.session is not None:
            if r.session in last:
                expected = min(last[r.session] // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS, r.input_tokens)
            last[r.session] = r.input_tokens
        assert reused == expected
    assert all(r.session is None for r in trace if SPEC[r.model].prefix_reuse == 0)


def test_session_reuse_matches_the_parameter() -> None:
    models = (
        ModelSpec("thinking", 0.9, reasoning=True, prefix_reuse=0.94, history_keep=0.15),
        ModelSpec("instruct", 0.1, prefix_reuse=0.15),
    )
    trace = synthetic_trace(seed=3, n_requests=3000, days=7, models=models)
    reuse = {r.model: r.ratio for r in ta.prefix_reuse(trace)}
    assert reuse["thinking"] > 0.9
    assert reuse["thinking"] == pytest.approx(0.94, abs=0.03)
    assert reuse["instruct"] == pytest.approx(0.15, abs=0.04)


def test_fit_hits_the_aggregate_targets() -> None:
    f = fit(DEFAULT_MODELS, PAPER)
    assert sum(f.request_share) == pytest.approx(1.0)
    assert math.exp(f.reasoning_mu) == pytest.approx(PAPER.reasoning_output_p50)
    # All non-reasoning answers, 1-2 token ones included, have the target median.
    plain = [(w, m) for w, m in zip(f.request_share, DEFAULT_MODELS, strict=True) if not m.reasoning]
    short = sum(w * m.short_output_share for w, m in plain) / sum(w for w, _ in plain)
    z = (math.log(PAPER.non_reasoning_output_p50) - f.body_mu) / f.body_sigma
    assert short + (1 - short) * 0.5 * (1 + math.erf(z / math.sqrt(2))) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="1-2 tokens"):
        fit((ModelSpec("classifier", 1.0, short_output_share=0.6),), PAPER)
    with pytest.raises(ValueError):
        synthetic_trace(n_requests=0)
    assert np.isclose(sum(m.token_share for m in DEFAULT_MODELS), 1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"token_share": 0},
        {"prefix_reuse": 1.0},
        {"start_frac": 1.0},
        {"short_output_share": 1.5},
        {"burst_rpm": 0},
    ],
)
def test_specs_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="m:"):
        ModelSpec(**{"name": "m", "token_share": 1.0, **bad})  # type: ignore[arg-type]
