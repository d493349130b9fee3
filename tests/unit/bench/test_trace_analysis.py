"""The section 6.2 statistics recover what constructed traces were built with."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.bench import trace_analysis as ta
from opentela.bench.traces import PREFIX_BLOCK_TOKENS, TraceRecord

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 60  # a minute boundary


def rec(t: float, model: str = "m", inp: int = 10, out: int = 10, **kw: object) -> TraceRecord:
    return TraceRecord(timestamp=t, model=model, input_tokens=inp, output_tokens=out, **kw)  # type: ignore[arg-type]


# --- percentiles --------------------------------------------------------------------------------------------


def test_percentiles_of_a_known_set() -> None:
    assert ta.percentiles(range(1, 101)) == (50.0, 95.0, 99.0)
    assert ta.percentiles([7]) == (7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in ta.percentiles([]))


@settings(max_examples=50)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=200), st.sampled_from([1, 25, 50, 95, 99, 100]))
def test_percentile_is_the_nearest_rank(values: list[int], q: int) -> None:
    (p,) = ta.percentiles(values, (q,))
    assert p in values
    n = len(values)
    assert sum(v <= p for v in values) >= q / 100 * n
    assert sum(v < p for v in values) < q / 100 * n or q == 0


# --- Fig. 9 -------------------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4),
        st.lists(st.integers(0, 5000), min_size=1, max_size=5),
        min_size=1,
        max_size=8,
    )
)
def test_ranking_order_and_shares_are_exact(sizes: dict[str, list[int]]) -> None:
    trace = [rec(T0 + i, model, n, 1) for model, ns in sizes.items() for i, n in enumerate(ns)]
    ranking = ta.model_ranking(trace)
    tokens = {m: sum(ns) + len(ns) for m, ns in sizes.items()}
    total = sum(tokens.values())
    assert ranking.total_tokens == total
    assert [m.model for m in ranking.models] == sorted(tokens, key=lambda m: (-tokens[m], m))
    for m in ranking.models:
        assert m.tokens == tokens[m.model] and m.requests == len(sizes[m.model])
        assert m.share == tokens[m.model] / total
    assert ranking.top3_share == pytest.approx(sum(sorted(tokens.values(), reverse=True)[:3]) / total)
    assert sum(ranking.tiers) == len(tokens)


@pytest.mark.parametrize("exponent", [0.8, 1.0, 2.0])
def test_a_power_law_ranking_has_its_slope(exponent: float) -> None:
    trace = [rec(T0, f"m{r}", round(1e9 * r**-exponent), 0) for r in range(1, 21)]
    ranking = ta.model_ranking(trace)
    assert ranking.slope == pytest.approx(-exponent, abs=1e-6)
    assert ranking.slope_r2 == pytest.approx(1.0, abs=1e-9)


def test_tiers_split_at_the_largest_drops() -> None:
    shares = [100, 90, 80, 20, 18, 16, 15, 2, 1.9, 1.8, 1.7, 1.6]  # three tiers
    trace = [rec(T0, f"m{i:02d}", int(s * 1000), 0) for i, s in enumerate(shares)]
    assert ta.model_ranking(trace).tiers == (3, 4, 5)
    assert ta.model_ranking(trace, n_tiers=2).tiers == (7, 5)


# --- Figs. 10-11 --------------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=40),
    st.integers(1, 5000),
    st.lists(st.integers(0, 500), min_size=40, max_size=40),
)
def test_a_constant_rate_has_burstiness_one(
    requests_per_minute: list[int], tpm: int, idle: list[int]
) -> None:
    trace, minute = [], 0
    for k, (n, gap) in enumerate(zip(requests_per_minute, idle, strict=False)):
        # The minute's tokens split over its requests; idle minutes between active ones change nothing.
        parts = [tpm // n + (1 if j < tpm % n else 0) for j in range(n)]
        trace += [rec(T0 + 60 * minute + 59 * j / n, "m", p, 0) for j, p in enumerate(parts)]
        minute += 1 + gap * (k % 2)
    (b,) = ta.burstiness(trace)
    assert b.magnitude == pytest.approx(1.0)
    assert b.active_minutes == len(requests_per_minute)
    assert np.allclose(b.burstiness, 1.0)
    assert b.minutes[0] == 0


@settings(max_examples=50)
@given(st.integers(2, 100), st.integers(2, 400), st.integers(1, 1000), st.integers(0, 10_000))
def test_one_burst_of_k_times_the_rate(k: int, minutes: int, base: int, idle: int) -> None:
    trace = [rec(T0 + 60 * m, "m", base, 0) for m in range(minutes - 1)]
    burst_minute = minutes - 1 + idle  # after a quiet spell, which the active-minute average ignores
    trace += [rec(T0 + 60 * burst_minute + j / 2, "m", base, 0) for j in range(k)]
    (b,) = ta.burstiness(trace)
    # Mean over active minutes: (minutes - 1 + k) * base / minutes.
    assert b.magnitude == pytest.approx(k * minutes / (minutes - 1 + k))
    assert b.peak_minute == burst_minute
    assert b.mean_tpm == pytest.approx(base * (minutes - 1 + k) / minutes)


def test_a_burst_among_many_minutes_reads_as_its_multiple() -> None:
    trace = [rec(T0 + 60 * m, "m", 100, 0) for m in range(10_000)] + [rec(T0 + 60 * 5000 + 1, "m", 2900, 0)]
    (b,) = ta.burstiness(trace)
    assert b.magnitude == pytest.approx(30, rel=0.01)


def test_burstiness_is_per_model_most_bursty_first() -> None:
    trace = [rec(T0 + 60 * m, "flat", 10, 0) for m in range(10)]
    trace += [rec(T0 + 60 * m, "spiky", 10 if m else 100, 0) for m in range(10)]
    assert [b.model for b in ta.burstiness(trace)] == ["spiky", "flat"]
    assert [b.model for b in ta.burstiness(trace, models=["flat"])] == ["flat"]


# --- Fig. 12 ------------------------------------------------------------------------------------------------


def test_length_percentiles_and_short_outputs() -> None:
    trace = [rec(T0 + i, "a", i, 1 if i % 4 == 0 else 100 + i) for i in range(1, 101)]
    trace += [rec(T0 + i, "b", 1000, 2) for i in range(50)]
    overall, per_model = ta.length_stats(trace)
    assert overall.requests == 150
    assert (overall.input_p50, overall.input_p95, overall.input_p99) == ta.percentiles(
        [r.input_tokens for r in trace]
    )
    assert overall.short_output_share == pytest.approx((25 + 50) / 150)
    a, b = per_model
    assert (a.model, a.input_p50, a.input_p95, a.input_p99, a.short_output_share) == ("a", 50, 95, 99, 0.25)
    assert (b.model, b.output_p50, b.short_output_share) == ("b", 2, 1.0)


# --- Fig. 13 ------------------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(1, 10), st.integers(0, 10)), min_size=1, max_size=10))
def test_output_ratio_per_day(days: list[tuple[int, int]]) -> None:
    # Day d: one request with inp input tokens and out output tokens, and another half as long.
    trace = [
        rec(T0 + d * ta.DAY_S + h, "m", inp * f, out * f)
        for d, (inp, out) in enumerate(days)
        for h, f in ((5, 2), (7, 1))
    ]
    r = ta.output_ratio(trace, "m")
    assert list(r.bucket) == list(range(len(days)))
    for d, (inp, out) in enumerate(days):
        assert r.ratio[d] == pytest.approx(out / (inp + out))
        assert r.p50[d] == pytest.approx(out / (inp + out))
    assert r.overall == pytest.approx(sum(o for _, o in days) / sum(i + o for i, o in days))


# --- Fig. 14 ------------------------------------------------------------------------------------------------


def chain_hashes(tokens: list[int]) -> tuple[str, ...]:
    """Chained hashes of 16-token blocks, the last one partial, as the trace schema describes."""
    out, prev = [], b""
    for i in range(0, len(tokens), PREFIX_BLOCK_TOKENS):
        prev = hashlib.sha256(prev + repr(tokens[i : i + PREFIX_BLOCK_TOKENS]).encode()).digest()
        out.append(prev.hex()[:16])
    return tuple(out)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 300), st.lists(st.integers(1, 200), min_size=0, max_size=5)),
        min_size=1,
        max_size=6,
    )
)
def test_session_reuse_equals_the_constructed_ratio(sessions: list[tuple[int, list[int]]]) -> None:
    """Each session's turn repeats the whole previous prompt and adds tokens; reuse is the previous prompt's
    full blocks, capped at the prompt."""
    trace, reused, total, t, fresh = [], 0, 0, T0, 10**6
    for first, added in sessions:
        prompt = list(range(fresh, fresh + first))
        fresh += first
        previous = None
        for extra in [0, *added]:
            prompt = prompt + list(range(fresh, fresh + extra))
            fresh += extra
            trace.append(rec(t, "m", len(prompt), 1, prefix_hashes=chain_hashes(prompt)))
            if previous is not None:
                reused += min(previous // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS, len(prompt))
            total += len(prompt)
            previous = len(prompt)
            t += 30.0
    got = ta.reused_tokens(trace)
    (reuse,) = ta.prefix_reuse(trace)
    assert int(got.sum()) == reused
    assert reuse.ratio == pytest.approx(reused / total)


def test_reuse_window_and_models() -> None:
    prompt = list(range(64))
    h = chain_hashes(prompt)
    trace = [
        rec(T0, "a", 64, 1, prefix_hashes=h),
        rec(T0 + 10, "b", 64, 1, prefix_hashes=h),  # another model: its own history
        rec(T0 + 7200, "a", 64, 1, prefix_hashes=h),  # two hours later: outside the default window
        rec(T0 + 7300, "a", 40, 1, prefix_hashes=h[:3]),  # a repeat within it, capped at its input
        rec(T0 + 7400, "a", 40, 1),  # no hashes: left out
    ]
    assert ta.reused_tokens(trace).tolist() == [0, 0, 0, 40, -1]
    assert ta.reused_tokens(trace, window_s=None).tolist() == [0, 0, 64, 40, -1]
    by_model = {r.model: r for r in ta.prefix_reuse(trace, window_s=None)}
    assert by_model["a"].ratio == pytest.approx(104 / 168) and by_model["a"].requests == 3
    assert by_model["b"].ratio == 0.0


def reference_reuse(trace: list[TraceRecord], window: float | None) -> list[int]:
    """The definition, written plainly: a dict per model of when each hash was last sent."""
    order = sorted(range(len(trace)), key=lambda i: trace[i].timestamp)
    seen: dict[str, dict[str, float]] = {}
    out = [-1] * len(trace)
    for i in order:
        r = trace[i]
        if not r.prefix_hashes:
            continue
        last = seen.setdefault(r.model, {})
        n = 0
        while n < len(r.prefix_hashes) and r.prefix_hashes[n] in last:
            if window is not None and r.timestamp - last[r.prefix_hashes[n]] > window:
                break
            n += 1
        out[i] = min(n * PREFIX_BLOCK_TOKENS, r.input_tokens)
        for x in r.prefix_hashes:
            last[x] = r.timestamp
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 20),  # timestamp: many ties
            st.sampled_from(["a", "b"]),
            st.integers(0, 200),
            st.integers(0, 4),  # which of a few shared prompt stems
            st.integers(0, 6),  # how many of its blocks
        ),
        max_size=30,
    ),
    st.sampled_from([None, 0.0, 5.0, 3600.0]),
)
def test_reuse_matches_the_plain_definition(
    rows: list[tuple[int, str, int, int, int]], window: float | None
) -> None:
    stems = [chain_hashes(list(range(s * 1000, s * 1000 + 96))) for s in range(5)]
    trace = [rec(float(t), m, n, 1, prefix_hashes=stems[s][:k]) for t, m, n, s, k in rows]
    assert ta.reused_tokens(trace, window).tolist() == reference_reuse(trace, window)


# --- Fig. 15 and the whole analysis -------------------------------------------------------------------------


def test_reasoning_split_leaves_unknown_out() -> None:
    trace = [rec(T0 + i, "r", 10, 1000 + i, e2e_s=float(i), reasoning=True) for i in range(1, 101)]
    trace += [rec(T0 + i, "n", 10, i, e2e_s=i / 10, reasoning=False) for i in range(1, 21)]
    trace += [rec(T0, "n", 10, 5, reasoning=False), rec(T0, "u", 10, 10**6, e2e_s=10**6)]
    r, n = ta.reasoning_latency(trace)
    assert (r.requests, r.e2e_p50, r.e2e_p95, r.output_p50, r.output_p95) == (100, 50, 95, 1050, 1095)
    assert (n.requests, n.with_latency, n.e2e_p95) == (21, 20, 1.9)


def test_analyze_checks_its_input() -> None:
    with pytest.raises(ValueError, match="no requests"):
        ta.analyze([])
    with pytest.raises(ValueError, match="'nope' is not in the trace"):
        ta.analyze([rec(T0)], ta.FigureModels.same(["nope"]))
    a = ta.analyze([rec(T0, "x"), rec(T0 + 1, "y"), rec(T0 + 2, "y")])
    assert a.figures.lengths == ("y", "x") and a.figures.reuse == ()
    assert a.requests == 3 and a.ranking.models[0].model == "y"
