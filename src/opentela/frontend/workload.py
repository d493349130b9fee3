"""The workload of the last hour, day or week, as the trace analysis of the paper's section 6.2 sees it (the
dashboard's Workload tab).

The window's completed usage rows are read column by column (the newest MAX_ROWS of them), turned into the
`TraceColumns` every statistic of `opentela.bench.trace_analysis` takes, and analysed in a worker thread; the totals
come from one SQL aggregate over the whole window. Prefix reuse is computed over the newest requests with prefix
hashes (MAX_HASHED, MAX_HASHES). What comes back is plain JSON, thinned for drawing.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
from sqlalchemy import Integer, cast, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from opentela.bench.trace_analysis import (
    DAY_S,
    HOUR_S,
    TraceColumns,
    burstiness,
    ecdf,
    length_stats,
    model_ranking,
    output_ratio,
    prefix_reuse,
    prefix_sightings,
    reasoning_latency,
)
from opentela.errors import InvalidRequestError
from opentela.frontend.db import Database
from opentela.frontend.prefix_hashes import HASH_BYTES, unpack
from opentela.frontend.schema import UsageRow

WINDOWS = {"hour": HOUR_S, "day": DAY_S, "week": 7 * DAY_S}
CHART_BUCKET_S = {"hour": 60, "day": 600, "week": 3600}
"""Seconds per point of the tokens-per-minute chart: each point is its busiest minute, so no burst is averaged away."""
RATIO_BUCKET_S = {"hour": 300, "day": 3600, "week": 6 * 3600}
"""Seconds per point of the output-ratio chart."""
MAX_ROWS = 100_000
"""Requests analysed per window, the newest first; the totals still cover the whole window."""
MAX_HASHED = 20_000
MAX_HASHES = 250_000
"""The reuse ratio covers the newest MAX_HASHED requests with prefix hashes, or fewer when they have more than
MAX_HASHES blocks (together about 0.2 s of work)."""
TOP_MODELS = 5
"""Models drawn one by one in the per-model charts (by tokens); the tables list every model."""
CDF_POINTS = 100
REUSE_WINDOW_S = HOUR_S
"""A prefix counts as reusable when the same model saw it within this many seconds before (the paper's hour)."""

# Unknowns come as -1 so that every column but the model converts to one array at once.
_COLUMNS = (
    UsageRow.model,
    UsageRow.started_at,
    UsageRow.input_tokens,
    UsageRow.output_tokens,
    func.coalesce(UsageRow.latency_ms, -1.0),
    func.coalesce(cast(UsageRow.reasoning, Integer), -1),
)


def window_seconds(window: str) -> float:
    """The length of a named window; 400 for an unknown name."""
    if window not in WINDOWS:
        raise InvalidRequestError(
            f"window must be one of {', '.join(WINDOWS)}, not {window!r}", param="window"
        )
    return WINDOWS[window]


def _in_window(since: float, until: float) -> tuple[Any, ...]:
    return (UsageRow.status == "ok", UsageRow.started_at >= since, UsageRow.started_at < until)


async def workload(db: Database, window: str, *, now: float | None = None) -> dict[str, Any]:
    """The window's statistics as JSON (see docs/frontend.md, "Workload")."""
    span = window_seconds(window)
    until = time.time() if now is None else now
    since = until - span
    where = _in_window(since, until)
    async with db.engine.connect() as conn:
        n, tokens_in, tokens_out = (
            await conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(UsageRow.input_tokens), 0),
                    func.coalesce(func.sum(UsageRow.output_tokens), 0),
                ).where(*where)
            )
        ).one()
        rows = (
            await conn.execute(
                select(*_COLUMNS).where(*where).order_by(UsageRow.started_at.desc()).limit(MAX_ROWS)
            )
        ).all()
        hashed = await _hashed_rows(conn, where)
    out: dict[str, Any] = {
        "window": window,
        "since": since,
        "until": until,
        "totals": {"requests": int(n), "input_tokens": int(tokens_in), "output_tokens": int(tokens_out)},
        "analysed": len(rows),
        "truncated": int(n) > len(rows),
    }
    out.update(await asyncio.to_thread(_analyse, rows, hashed, window, since))
    return _finite(out)


async def _hashed_rows(conn: AsyncConnection, where: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The newest hashed requests of the window, up to MAX_HASHED of them and about MAX_HASHES blocks in all (the
    hashes still as stored)."""
    q = (
        select(UsageRow.started_at, UsageRow.model, UsageRow.input_tokens, UsageRow.prefix_hashes)
        .where(*where, UsageRow.prefix_hashes.is_not(None))
        .order_by(UsageRow.started_at.desc())
        .limit(MAX_HASHED)
    )
    out: list[tuple[Any, ...]] = []
    stored = 0
    result = await conn.stream(q.execution_options(yield_per=5000))
    try:
        async for part in result.partitions():
            for row in part:
                out.append(tuple(row))
                stored += len(row[3] or b"")
            if stored >= MAX_HASHES * HASH_BYTES:
                break
    finally:
        await result.close()
    return out


def _columns(models: list[str], started: Any, inp: Any, outp: Any, **extra: Any) -> TraceColumns:
    codes: dict[str, int] = {}
    n = len(models)
    code = np.fromiter((codes.setdefault(m, len(codes)) for m in models), np.int32, n)
    return TraceColumns(
        models=tuple(codes),
        model=code,
        timestamp=np.array(started, dtype=np.float64),
        input_tokens=np.array(inp, dtype=np.int64),
        output_tokens=np.array(outp, dtype=np.int64),
        e2e_s=extra.get("e2e_s", np.full(n, math.nan)),
        reasoning=extra.get("reasoning", np.full(n, -1, dtype=np.int8)),
        prefix_hashes=extra.get("prefix_hashes", [()] * n),
    )


def _analyse(rows: Sequence[Any], hashed: list[Any], window: str, since: float) -> dict[str, Any]:
    """In a worker thread: every statistic of the window's rows (newest first, as read)."""
    if not rows:
        return _empty(window, since)
    rows = rows[::-1]  # arrival order
    numbers = np.array([r[1:] for r in rows], dtype=np.float64)
    latency_ms = numbers[:, 3]
    cols = _columns(
        [r[0] for r in rows],
        numbers[:, 0],
        numbers[:, 1],
        numbers[:, 2],
        e2e_s=np.where(latency_ms < 0, math.nan, latency_ms / 1000),
        reasoning=numbers[:, 4].astype(np.int8),
    )
    ranking = model_ranking(cols)
    top = [m.model for m in ranking.models[:TOP_MODELS]]
    bursts = burstiness(cols)
    overall, per_model = length_stats(cols)
    reasoned, plain = reasoning_latency(cols)
    return {
        "ranking": {
            "total_tokens": ranking.total_tokens,
            "top3_share": ranking.top3_share,
            "slope": ranking.slope,
            "models": [asdict(m) for m in ranking.models],
        },
        "burstiness": [
            {
                "model": b.model,
                "requests": b.requests,
                "active_minutes": b.active_minutes,
                "mean_tpm": b.mean_tpm,
                "peak_tpm": b.peak_tpm,
                "magnitude": b.magnitude,
            }
            for b in bursts
        ],
        "tpm": _tpm_series(cols, bursts, top, CHART_BUCKET_S[window], since),
        "lengths": {
            "all": asdict(overall),
            "models": [asdict(s) for s in per_model],
            "cdf": {
                name: {
                    "input": _points(*ecdf(cols.input_tokens[sel], CDF_POINTS)),
                    "output": _points(*ecdf(cols.output_tokens[sel], CDF_POINTS)),
                }
                for name, sel in [("all", slice(None)), *((m, cols.model == cols.code(m)) for m in top)]
            },
        },
        "output_ratio": _ratios(cols, top, RATIO_BUCKET_S[window]),
        "prefix_reuse": _reuse(hashed),
        "reasoning": {
            "reasoning": asdict(reasoned),
            "non_reasoning": asdict(plain),
            "unknown": int(np.sum(cols.reasoning < 0)),
        },
    }


def _empty(window: str, since: float) -> dict[str, Any]:
    return {
        "ranking": {"total_tokens": 0, "top3_share": 0.0, "slope": None, "models": []},
        "burstiness": [],
        "tpm": {"start": since, "bucket_s": CHART_BUCKET_S[window], "models": {}},
        "lengths": {"all": None, "models": [], "cdf": {}},
        "output_ratio": {"bucket_s": RATIO_BUCKET_S[window], "models": []},
        "prefix_reuse": {"window_s": REUSE_WINDOW_S, "requests": 0, "ratio": None, "models": []},
        "reasoning": {"reasoning": None, "non_reasoning": None, "unknown": 0},
    }


def _points(x: Any, f: Any) -> list[list[float]]:
    return [[float(a), float(b)] for a, b in zip(x, f, strict=True)]


def _tpm_series(
    cols: TraceColumns, bursts: list[Any], top: list[str], bucket_s: int, since: float
) -> dict[str, Any]:
    """Tokens per minute of the top models: per chart bucket, the TPM of its busiest minute (0 when idle)."""
    start = math.floor(since / bucket_s) * bucket_s
    n = max(1, math.ceil((float(cols.timestamp.max()) + 1 - start) / bucket_s))
    by_name = {b.model: b for b in bursts}
    series = {}
    for name in top:
        b = by_name[name]
        first_minute = math.floor(float(cols.timestamp[cols.model == cols.code(name)].min()) / 60)
        minute_t = (first_minute + b.minutes) * 60.0
        index = np.clip(((minute_t - start) // bucket_s).astype(np.int64), 0, n - 1)
        peak = np.zeros(n)
        np.maximum.at(peak, index, b.burstiness * b.mean_tpm)
        series[name] = [round(float(v), 3) for v in peak]
    return {"start": start, "bucket_s": bucket_s, "models": series}


def _ratios(cols: TraceColumns, top: list[str], bucket_s: int) -> dict[str, Any]:
    """Output / (input + output) per bucket of each top model, at absolute bucket start times."""
    origin = float(cols.timestamp.min())
    models = []
    for name in top:
        r = output_ratio(cols, name, bucket_s)
        points = [
            [origin + int(b) * bucket_s, float(ratio), float(p25), float(p50), float(p75), int(k)]
            for b, ratio, p25, p50, p75, k in zip(
                r.bucket, r.ratio, r.p25, r.p50, r.p75, r.requests, strict=True
            )
        ]
        models.append({"model": name, "overall": r.overall, "points": points})
    return {"bucket_s": bucket_s, "models": models}


def _reuse(hashed: list[Any]) -> dict[str, Any]:
    """Reusable share of prompt tokens per model, over the hashed requests read (see trace_analysis.reused_tokens)."""
    if not hashed:
        return {"window_s": REUSE_WINDOW_S, "requests": 0, "ratio": None, "models": []}
    hashed = hashed[::-1]
    started, models, inp, stored = (list(c) for c in zip(*hashed, strict=True))
    hashes = [unpack(s) for s in stored]
    cols = _columns(models, started, inp, [0] * len(models), prefix_hashes=hashes)
    sightings = prefix_sightings(cols)
    reused = sightings.reused(REUSE_WINDOW_S)
    counted = (reused >= 0) & (cols.input_tokens > 0)
    total = int(cols.input_tokens[counted].sum())
    return {
        "window_s": REUSE_WINDOW_S,
        "requests": int(counted.sum()),
        "since": float(cols.timestamp.min()),
        "ratio": float(reused[counted].sum()) / total if total else None,
        "models": [
            {"model": r.model, "requests": r.requests, "ratio": r.ratio}
            for r in prefix_reuse(cols, REUSE_WINDOW_S, sightings=sightings)
        ],
    }


def _finite(value: Any) -> Any:
    """The JSON value with NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
