"""The workload statistics of the paper's section 6.2 (Figures 9-15), as pure NumPy functions over a trace.

Every function takes a list of `TraceRecord`s or, to share one conversion between several statistics, the
`TraceColumns` that `columns()` makes of it, and returns plain dataclasses. Percentiles are nearest-rank (the
smallest value with at least q % of the values at or below it), as in `opentela.bench.report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise

import numpy as np

from opentela.bench.trace_columns import (
    Floats,
    Ints,
    TraceColumns,
    TraceData,
    by_model,
    columns,
    ecdf,
    percentiles,
)
from opentela.bench.traces import PREFIX_BLOCK_TOKENS

__all__ = [
    "DAY_S",
    "HOUR_S",
    "SHORT_OUTPUT_TOKENS",
    "Burstiness",
    "FigureModels",
    "LatencyStats",
    "LengthStats",
    "ModelRanking",
    "ModelTokens",
    "OutputRatio",
    "PrefixReuse",
    "PrefixSightings",
    "TraceAnalysis",
    "TraceColumns",
    "TraceData",
    "analyze",
    "burstiness",
    "columns",
    "default_figure_models",
    "ecdf",
    "length_stats",
    "model_ranking",
    "output_ratio",
    "percentiles",
    "prefix_reuse",
    "prefix_sightings",
    "reasoning_latency",
    "reused_tokens",
]

DAY_S = 86_400.0
HOUR_S = 3_600.0
SHORT_OUTPUT_TOKENS = 2
"""Outputs of at most this many tokens count as classifier or guardrail traffic (the paper's 1-2 tokens)."""


# --- Fig. 9: tokens per model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelTokens:
    """One model's token consumption."""

    model: str
    requests: int
    input_tokens: int
    output_tokens: int
    tokens: int
    share: float
    """Of all tokens of the trace."""


@dataclass(frozen=True)
class ModelRanking:
    """Models ranked by tokens (input + output), highest first, with the power-law shape of the ranking."""

    models: tuple[ModelTokens, ...]
    total_tokens: int
    top3_share: float
    slope: float
    """Least-squares slope of log10(tokens) against log10(rank) over models with tokens; NaN under 2 models."""
    slope_r2: float
    tiers: tuple[int, ...]
    """Models per tier, top tier first: the ranking cut at its largest drops of log10(tokens) between ranks."""


def model_ranking(trace: TraceData, n_tiers: int = 3) -> ModelRanking:
    """Fig. 9: tokens per model, ranked; top-3 share, rank/size slope on log-log axes, and tiers."""
    cols = columns(trace)
    k = len(cols.models)
    inp = np.bincount(cols.model, weights=cols.input_tokens, minlength=k).astype(np.int64)
    out = np.bincount(cols.model, weights=cols.output_tokens, minlength=k).astype(np.int64)
    reqs = np.bincount(cols.model, minlength=k)
    total = int(inp.sum() + out.sum())
    rows = sorted(
        (
            ModelTokens(
                name,
                int(reqs[i]),
                int(inp[i]),
                int(out[i]),
                int(inp[i] + out[i]),
                (int(inp[i] + out[i]) / total) if total else 0.0,
            )
            for i, name in enumerate(cols.models)
        ),
        key=lambda m: (-m.tokens, m.model),
    )
    sizes = np.array([m.tokens for m in rows if m.tokens > 0], dtype=np.float64)
    slope, r2 = _loglog_fit(sizes)
    return ModelRanking(
        models=tuple(rows),
        total_tokens=total,
        top3_share=sum(m.share for m in rows[:3]),
        slope=slope,
        slope_r2=r2,
        tiers=_tiers(sizes, n_tiers),
    )


def _loglog_fit(sizes: Floats) -> tuple[float, float]:
    if sizes.size < 2:
        return math.nan, math.nan
    x = np.log10(np.arange(1, sizes.size + 1))
    y = np.log10(sizes)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    spread = float(((y - y.mean()) ** 2).sum())
    return float(slope), (1.0 - float((resid**2).sum()) / spread) if spread else 1.0


def _tiers(sizes: Floats, n_tiers: int) -> tuple[int, ...]:
    if sizes.size == 0:
        return ()
    drops = -np.diff(np.log10(sizes))
    n_cuts = min(max(n_tiers - 1, 0), drops.size)
    # The largest drops, the earlier rank first among equal ones; cut after rank i means tier sizes change there.
    cuts = sorted(np.argsort(-drops, kind="stable")[:n_cuts] + 1)
    edges = [0, *cuts, sizes.size]
    return tuple(int(b - a) for a, b in pairwise(edges))


# --- Figs. 10-11: burstiness --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Burstiness:
    """One model's tokens per minute (TPM) against its average over active minutes."""

    model: str
    requests: int
    active_minutes: int
    """Minutes (wall-clock buckets) with at least one request."""
    mean_tpm: float
    """Average TPM over active minutes only."""
    peak_tpm: float
    magnitude: float
    """Peak instantaneous burstiness: peak TPM / mean TPM (1 for a constant rate)."""
    peak_minute: int
    """Minutes from the model's first active minute to its peak."""
    minutes: Ints = field(repr=False)
    """Active minutes, counted from the model's first one (Fig. 11's t = 0)."""
    burstiness: Floats = field(repr=False)
    """Instantaneous burstiness (TPM / mean TPM) of each active minute."""


def burstiness(trace: TraceData, models: Sequence[str] | None = None) -> list[Burstiness]:
    """Figs. 10-11: per model, instantaneous burstiness per active minute and its peak, most bursty first.

    TPM is the input plus output tokens of the requests arriving in a wall-clock minute. The average is taken over
    active minutes only (those with at least one request), so idle hours do not inflate the ratio.
    """
    cols = columns(trace)
    minute = np.floor(cols.timestamp / 60.0).astype(np.int64)
    tokens = cols.tokens.astype(np.float64)
    wanted = None if models is None else {cols.code(m) for m in models}
    out = []
    for code, idx in enumerate(by_model(cols)):
        if idx.size == 0 or (wanted is not None and code not in wanted):
            continue
        active, inverse = np.unique(minute[idx], return_inverse=True)
        tpm = np.bincount(inverse, weights=tokens[idx], minlength=active.size)
        mean = float(tpm.mean())
        ratio = tpm / mean if mean > 0 else np.ones(tpm.size)
        peak = int(np.argmax(ratio))
        out.append(
            Burstiness(
                model=cols.models[code],
                requests=int(idx.size),
                active_minutes=int(active.size),
                mean_tpm=mean,
                peak_tpm=float(tpm[peak]),
                magnitude=float(ratio[peak]),
                peak_minute=int(active[peak] - active[0]),
                minutes=active - active[0],
                burstiness=ratio,
            )
        )
    out.sort(key=lambda b: (-b.magnitude, b.model))
    return out


# --- Fig. 12: input and output lengths ----------------------------------------------------------------------


@dataclass(frozen=True)
class LengthStats:
    """Input and output length percentiles of one model, or of all requests (`model` "all")."""

    model: str
    requests: int
    input_p50: float
    input_p95: float
    input_p99: float
    output_p50: float
    output_p95: float
    output_p99: float
    short_output_share: float
    """Requests with at most SHORT_OUTPUT_TOKENS output tokens (classifier or guardrail traffic)."""


def _length_stats(name: str, inp: Ints, out: Ints) -> LengthStats:
    i50, i95, i99 = percentiles(inp)
    o50, o95, o99 = percentiles(out)
    short = float(np.mean(out <= SHORT_OUTPUT_TOKENS)) if out.size else math.nan
    return LengthStats(name, int(inp.size), i50, i95, i99, o50, o95, o99, short)


def length_stats(trace: TraceData) -> tuple[LengthStats, list[LengthStats]]:
    """Fig. 12: the aggregate P50/P95/P99 of input and output tokens, and the same per model (most requests first)."""
    cols = columns(trace)
    per_model = [
        _length_stats(cols.models[code], cols.input_tokens[idx], cols.output_tokens[idx])
        for code, idx in enumerate(by_model(cols))
        if idx.size
    ]
    per_model.sort(key=lambda s: (-s.requests, s.model))
    return _length_stats("all", cols.input_tokens, cols.output_tokens), per_model


# --- Fig. 13: output token ratio ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class OutputRatio:
    """One model's output / (input + output) per time bucket, counted from the trace's first request."""

    model: str
    bucket_s: float
    overall: float
    """All the model's output tokens over all its tokens."""
    bucket: Ints = field(repr=False)
    """Bucket index (day, by default) of each bucket with requests."""
    ratio: Floats = field(repr=False)
    """Token-weighted: the bucket's output tokens over its input + output tokens."""
    p25: Floats = field(repr=False)
    p50: Floats = field(repr=False)
    p75: Floats = field(repr=False)
    """Quartiles of the per-request ratio in the bucket."""
    requests: Ints = field(repr=False)


def output_ratio(trace: TraceData, model: str, bucket_s: float = DAY_S) -> OutputRatio:
    """Fig. 13: the output token ratio of `model` per bucket (a day by default) over the trace."""
    cols = columns(trace)
    sel = (cols.model == cols.code(model)) & (cols.tokens > 0)
    inp, outp = cols.input_tokens[sel], cols.output_tokens[sel]
    origin = float(cols.timestamp.min()) if len(cols) else 0.0
    bucket = np.floor((cols.timestamp[sel] - origin) / bucket_s).astype(np.int64)
    per_request = outp / (inp + outp)
    keys, inverse = np.unique(bucket, return_inverse=True)
    out_sum = np.bincount(inverse, weights=outp, minlength=keys.size)
    all_sum = np.bincount(inverse, weights=inp + outp, minlength=keys.size)
    q = _group_quantiles(inverse, per_request, keys.size, (25, 50, 75))
    total = float(inp.sum() + outp.sum())
    return OutputRatio(
        model=model,
        bucket_s=bucket_s,
        overall=float(outp.sum()) / total if total else math.nan,
        bucket=keys,
        ratio=out_sum / all_sum,
        p25=q[0],
        p50=q[1],
        p75=q[2],
        requests=np.bincount(inverse, minlength=keys.size).astype(np.int64),
    )


def _group_quantiles(group: Ints, values: Floats, n_groups: int, qs: Sequence[float]) -> list[Floats]:
    """Nearest-rank quantiles of `values` within each group 0..n_groups-1 (every group non-empty)."""
    order = np.lexsort((values, group))
    counts = np.bincount(group, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sorted_values = values[order]
    return [sorted_values[starts + np.maximum(np.ceil(q / 100 * counts).astype(np.int64) - 1, 0)] for q in qs]


# --- Fig. 14: reusable prefixes -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PrefixSightings:
    """For every prefix block of every request, how long before it the same model last saw that block's hash."""

    arrival: Ints
    """Request indexes in arrival order; the arrays below follow it."""
    input_tokens: Ints
    offsets: Ints
    """The i-th arriving request's blocks are entries offsets[i]:offsets[i + 1], in prompt order."""
    gap_s: Floats = field(repr=False)
    """Seconds since an earlier request of the same model carried the same hash; inf if none did."""

    def reused(self, window_s: float | None = HOUR_S) -> Ints:
        """Per request (trace order), its reusable input tokens within `window_s` (None: all history); -1 without
        hashes."""
        seen = np.isfinite(self.gap_s) if window_s is None else self.gap_s <= window_s
        counts = np.diff(self.offsets)
        position = np.arange(self.gap_s.size) - np.repeat(self.offsets[:-1], counts)
        # The first block not seen within the window ends the shared prefix; its position is the prefix's length.
        unseen_at = np.where(seen, np.iinfo(np.int64).max, position)
        has = counts > 0
        matched = np.zeros(counts.size, dtype=np.int64)
        if has.any():
            first_unseen = np.minimum.reduceat(unseen_at, self.offsets[:-1][has])
            matched[has] = np.minimum(first_unseen, counts[has])
        out = np.empty(counts.size, dtype=np.int64)
        out[self.arrival] = np.where(has, np.minimum(matched * PREFIX_BLOCK_TOKENS, self.input_tokens), -1)
        return out


_MIX = np.uint64(0x9E3779B97F4A7C15)


def prefix_sightings(trace: TraceData) -> PrefixSightings:
    """When each prefix block of each request was last seen before it (see `reused_tokens`)."""
    cols = columns(trace)
    arrival = np.argsort(cols.timestamp, kind="stable")
    counts = np.fromiter((len(cols.prefix_hashes[i]) for i in arrival.tolist()), np.int64, len(cols))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    # Python's 64-bit hash of the hex text stands in for it (equal texts hash equal; a collision among a few
    # million blocks has a probability around 1e-6), mixed with the model so that each model has its own history.
    flat = chain.from_iterable(cols.prefix_hashes[i] for i in arrival.tolist())
    rank = np.repeat(np.arange(len(cols)), counts)
    key = np.fromiter(map(hash, flat), np.int64, int(offsets[-1])).view(np.uint64)
    key = key ^ (cols.model[arrival][rank].astype(np.uint64) * _MIX)
    # Entries are in arrival order already, so a stable sort by key leaves each hash's sightings in that order.
    order = np.argsort(key, kind="stable")
    k, r = key[order], rank[order]
    same_hash = np.zeros(order.size, dtype=bool)
    same_hash[1:] = k[1:] == k[:-1]
    # The last sighting by an earlier request sits just before the run of this request's own entries (a run of
    # one entry, unless the request repeats a hash).
    run_start = np.ones(order.size, dtype=bool)
    run_start[1:] = ~same_hash[1:] | (r[1:] != r[:-1])
    start = np.maximum.accumulate(np.where(run_start, np.arange(order.size), 0))
    valid = same_hash[start]
    t = cols.timestamp[arrival][r]
    gap = np.full(order.size, math.inf)
    gap[valid] = t[valid] - t[start[valid] - 1]
    gap_s = np.empty_like(gap)
    gap_s[order] = gap
    return PrefixSightings(arrival, cols.input_tokens[arrival], offsets, gap_s)


def reused_tokens(trace: TraceData, window_s: float | None = HOUR_S) -> Ints:
    """Per request, its input tokens that repeat a prefix of the same model's recent requests (-1: no hashes).

    A request's prompt is hashed in 16-token blocks, each hash chained over all blocks before it, so two requests
    share block i's hash exactly when they share their first 16 (i + 1) tokens. The reusable prefix of a request
    is the number of its leading blocks whose hash an earlier request of the same model carried within `window_s`
    seconds before it (None: at any time before), times 16 tokens, capped at its input tokens. Requests are taken
    in arrival order (trace order among equal timestamps).
    """
    return prefix_sightings(trace).reused(window_s)


@dataclass(frozen=True, eq=False)
class PrefixReuse:
    """One model's reusable-prefix ratio, overall and per time bucket from its first request."""

    model: str
    window_s: float | None
    requests: int
    """Requests with prefix hashes and input tokens (the others are left out)."""
    ratio: float
    """Reusable input tokens over all input tokens of those requests."""
    bucket_s: float
    bucket: Ints = field(repr=False)
    """Bucket index from the model's first request (Fig. 14's model lifecycle)."""
    bucket_ratio: Floats = field(repr=False)


def prefix_reuse(
    trace: TraceData,
    window_s: float | None = HOUR_S,
    bucket_s: float = DAY_S,
    sightings: PrefixSightings | None = None,
) -> list[PrefixReuse]:
    """Fig. 14: per model with prefix hashes, the share of input tokens reusable from recent history (highest first).

    See `reused_tokens` for the definition; `sightings` passes `prefix_sightings(trace)` in when it is at hand.
    """
    cols = columns(trace)
    reused = (sightings or prefix_sightings(cols)).reused(window_s)
    out = []
    for code, idx in enumerate(by_model(cols)):
        idx = idx[(reused[idx] >= 0) & (cols.input_tokens[idx] > 0)]
        if idx.size == 0:
            continue
        t = cols.timestamp[idx]
        bucket = np.floor((t - t.min()) / bucket_s).astype(np.int64)
        keys, inverse = np.unique(bucket, return_inverse=True)
        hit = np.bincount(inverse, weights=reused[idx], minlength=keys.size)
        total = np.bincount(inverse, weights=cols.input_tokens[idx], minlength=keys.size)
        out.append(
            PrefixReuse(
                model=cols.models[code],
                window_s=window_s,
                requests=int(idx.size),
                ratio=float(hit.sum() / total.sum()),
                bucket_s=bucket_s,
                bucket=keys,
                bucket_ratio=hit / total,
            )
        )
    out.sort(key=lambda r: (-r.ratio, r.model))
    return out


# --- Fig. 15: reasoning vs non-reasoning --------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyStats:
    """E2E latency and output length of reasoning or non-reasoning requests."""

    kind: str
    """"reasoning" or "non-reasoning"."""
    requests: int
    with_latency: int
    """Requests with a known E2E latency (the latency percentiles are over these)."""
    e2e_p50: float
    e2e_p95: float
    output_p50: float
    output_p95: float


def reasoning_latency(trace: TraceData) -> tuple[LatencyStats, LatencyStats]:
    """Fig. 15: E2E latency and output tokens of reasoning and non-reasoning requests (unknown ones left out)."""
    cols = columns(trace)
    stats = []
    for flag, kind in ((1, "reasoning"), (0, "non-reasoning")):
        sel = cols.reasoning == flag
        e2e = cols.e2e_s[sel]
        e2e = e2e[~np.isnan(e2e)]
        e50, e95 = percentiles(e2e, (50, 95))
        o50, o95 = percentiles(cols.output_tokens[sel], (50, 95))
        stats.append(LatencyStats(kind, int(sel.sum()), int(e2e.size), e50, e95, o50, o95))
    return stats[0], stats[1]


# --- all of it ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FigureModels:
    """The models drawn in the per-model figures (Figs. 11-14); the tables cover every model."""

    burst: tuple[str, ...]
    lengths: tuple[str, ...]
    ratio: tuple[str, ...]
    reuse: tuple[str, ...]

    @classmethod
    def same(cls, models: Sequence[str]) -> FigureModels:
        """The same models in every per-model figure (`otela trace analyze --model`)."""
        chosen = tuple(models)
        return cls(chosen, chosen, chosen, chosen)


def default_figure_models(cols: TraceColumns, reuse: Sequence[PrefixReuse]) -> FigureModels:
    """As the paper picks them: most requests (Figs. 11-12), most days (Fig. 13), most hashed requests (Fig. 14)."""
    reqs = np.bincount(cols.model, minlength=len(cols.models))
    by_requests = sorted(range(len(cols.models)), key=lambda c: (-reqs[c], cols.models[c]))
    top4 = tuple(cols.models[c] for c in by_requests[:4])
    day = np.floor(cols.timestamp / DAY_S).astype(np.int64)
    days = [np.unique(day[idx]).size for idx in by_model(cols)]
    widest = min(range(len(cols.models)), key=lambda c: (-days[c], -reqs[c], cols.models[c]), default=None)
    hashed = sorted(reuse, key=lambda r: (-r.requests, r.model))[:2]
    return FigureModels(
        burst=top4,
        lengths=top4,
        ratio=() if widest is None else (cols.models[widest],),
        reuse=tuple(r.model for r in hashed),
    )


@dataclass(frozen=True, eq=False)
class TraceAnalysis:
    """Every statistic of section 6.2 for one trace."""

    requests: int
    start: float
    end: float
    """First and last arrival (the trace's own clock)."""
    ranking: ModelRanking
    burstiness: list[Burstiness]
    lengths: LengthStats
    model_lengths: list[LengthStats]
    output_ratio: list[OutputRatio]
    """For `figures.ratio`."""
    window_s: float | None
    reuse: list[PrefixReuse]
    reuse_all_history: list[PrefixReuse]
    reasoning: LatencyStats
    non_reasoning: LatencyStats
    figures: FigureModels


def analyze(
    trace: TraceData, figures: FigureModels | None = None, window_s: float | None = HOUR_S
) -> TraceAnalysis:
    """Every statistic of Figs. 9-15 (prefix reuse within `window_s` and over all history)."""
    cols = columns(trace)
    if len(cols) == 0:
        raise ValueError("the trace has no requests")
    for name in () if figures is None else {*figures.burst, *figures.lengths, *figures.ratio, *figures.reuse}:
        cols.code(name)
    sightings = prefix_sightings(cols)
    reuse = prefix_reuse(cols, window_s, sightings=sightings)
    reuse_all = reuse if window_s is None else prefix_reuse(cols, None, sightings=sightings)
    figures = default_figure_models(cols, reuse) if figures is None else figures
    lengths, model_lengths = length_stats(cols)
    reasoning, non_reasoning = reasoning_latency(cols)
    return TraceAnalysis(
        requests=len(cols),
        start=float(cols.timestamp.min()),
        end=float(cols.timestamp.max()),
        ranking=model_ranking(cols),
        burstiness=burstiness(cols),
        lengths=lengths,
        model_lengths=model_lengths,
        output_ratio=[output_ratio(cols, m) for m in figures.ratio],
        window_s=window_s,
        reuse=reuse,
        reuse_all_history=reuse_all,
        reasoning=reasoning,
        non_reasoning=non_reasoning,
        figures=figures,
    )
