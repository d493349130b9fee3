"""A trace analysis as tables, a JSON document and a self-contained HTML page (figures embedded as data URIs)."""

from __future__ import annotations

import base64
import datetime
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentela.bench.trace_analysis import DAY_S, TraceAnalysis

DEFINITIONS = (
    ("Tokens", "input + output tokens of a request; a model's share is its tokens over all tokens (Fig. 9)."),
    (
        "Tiers and slope",
        "the ranking cut at its largest drops of log10(tokens) between consecutive ranks; the slope is the "
        "least-squares fit of log10(tokens) against log10(rank).",
    ),
    (
        "Burstiness",
        "TPM: input + output tokens of the requests arriving in a wall-clock minute. Instantaneous burstiness: "
        "a minute's TPM over the model's mean TPM over active minutes (those with at least one request); "
        "magnitude: its peak (Figs. 10-11).",
    ),
    (
        "Percentiles",
        "nearest rank: the smallest value with at least q % of the values at or below it (Fig. 12).",
    ),
    ("Short outputs", "requests with at most 2 output tokens: classifier or guardrail traffic."),
    (
        "Output token ratio",
        "output / (input + output) tokens, summed per day, and per-request quartiles (Fig. 13).",
    ),
    (
        "Reusable prefix ratio",
        "per request, its leading 16-token blocks whose chained hash an earlier request of the same model carried "
        "within the window, times 16 tokens, capped at its input; summed over requests and divided by their "
        "input tokens (Fig. 14).",
    ),
    (
        "Reasoning",
        "requests marked reasoning vs not; latency percentiles over those with an E2E time (Fig. 15).",
    ),
)


@dataclass(frozen=True)
class Table:
    """One table of the report, as text cells."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    note: str = ""
    numeric: tuple[bool, ...] = field(default=())
    """Per column, whether it is right-aligned (numbers)."""


def _n(v: float, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.1f} %"


def tables(a: TraceAnalysis, top: int = 20) -> list[Table]:
    """The report's tables: one per figure, top `top` rows where a table ranks models."""
    rank = a.ranking
    cumulative = 0.0
    ranking_rows = []
    for i, m in enumerate(rank.models[:top], start=1):
        cumulative += m.share
        ranking_rows.append(
            (
                str(i),
                m.model,
                _n(m.requests),
                _n(m.input_tokens),
                _n(m.output_tokens),
                _pct(m.share),
                _pct(cumulative),
            )
        )
    more = len(rank.models) - top
    burst_rows = [
        (b.model, _n(b.requests), _n(b.active_minutes), _n(b.mean_tpm), _n(b.peak_tpm), _n(b.magnitude, 1))
        for b in a.burstiness[:15]
    ]
    length_rows = [
        (
            s.model,
            _n(s.requests),
            _n(s.input_p50),
            _n(s.input_p95),
            _n(s.input_p99),
            _n(s.output_p50),
            _n(s.output_p95),
            _n(s.output_p99),
            _pct(s.short_output_share),
        )
        for s in [a.lengths, *a.model_lengths[:top]]
    ]
    ratio_rows = [
        (
            r.model,
            _n(r.bucket.size),
            _pct(r.overall),
            _pct(float(r.ratio.min())),
            _pct(float(r.ratio.max())),
            _pct(float(r.ratio.std())),
        )
        for r in a.output_ratio
    ]
    all_history = {r.model: r.ratio for r in a.reuse_all_history}
    window = "all history" if a.window_s is None else f"{a.window_s / 3600:g} h window"
    reuse_rows = [
        (r.model, _n(r.requests), _pct(r.ratio), _pct(all_history.get(r.model, math.nan)))
        for r in sorted(a.reuse, key=lambda r: (-r.requests, r.model))[:top]
    ]
    latency_rows = [
        (s.kind, _n(s.requests), _n(s.e2e_p50, 2), _n(s.e2e_p95, 2), _n(s.output_p50), _n(s.output_p95))
        for s in (a.reasoning, a.non_reasoning)
    ]
    ratio = a.reasoning.e2e_p95 / a.non_reasoning.e2e_p95 if a.non_reasoning.e2e_p95 else math.nan
    return [
        Table(
            "fig09_model_tokens",
            "Fig. 9: tokens per model",
            ("#", "model", "requests", "input tokens", "output tokens", "share", "cumulative"),
            ranking_rows,
            f"{len(rank.models)} models, {rank.total_tokens:,} tokens; top 3: {_pct(rank.top3_share)}; log-log "
            f"rank/size slope {rank.slope:.2f} (R² {rank.slope_r2:.2f}); tiers of "
            f"{' / '.join(str(t) for t in rank.tiers)} models"
            + (f"; {more} more models not shown" if more > 0 else ""),
            (True, False, True, True, True, True, True),
        ),
        Table(
            "fig10_burstiness",
            "Fig. 10: burstiness magnitude (15 most bursty models)",
            ("model", "requests", "active minutes", "mean TPM (active)", "peak TPM", "magnitude"),
            burst_rows,
            "mean TPM over active minutes only; magnitude = peak TPM / mean TPM",
            (False, True, True, True, True, True),
        ),
        Table(
            "fig12_lengths",
            "Fig. 12: input and output tokens (all requests, then by model)",
            ("model", "requests", "in P50", "in P95", "in P99", "out P50", "out P95", "out P99", "out <= 2"),
            length_rows,
            "nearest-rank percentiles; out <= 2: share of requests with at most 2 output tokens",
            (False, *([True] * 8)),
        ),
        Table(
            "fig13_output_ratio",
            "Fig. 13: output token ratio per day",
            ("model", "days", "overall", "lowest day", "highest day", "std over days"),
            ratio_rows,
            "output / (input + output) tokens",
            (False, *([True] * 5)),
        ),
        Table(
            "fig14_prefix_reuse",
            "Fig. 14: reusable prefix ratio",
            ("model", "requests with hashes", window, "all history"),
            reuse_rows,
            "share of input tokens in leading 16-token blocks an earlier request of the model carried"
            if reuse_rows
            else "no request carries prefix hashes",
            (False, True, True, True),
        ),
        Table(
            "fig15_reasoning",
            "Fig. 15: reasoning vs non-reasoning requests",
            ("requests", "count", "E2E P50 (s)", "E2E P95 (s)", "output P50", "output P95"),
            latency_rows,
            f"reasoning P95 E2E is {ratio:.1f}x the non-reasoning one" if not math.isnan(ratio) else "",
            (False, *([True] * 5)),
        ),
    ]


def summary(a: TraceAnalysis) -> dict[str, Any]:
    """The analysis as a JSON-ready document (per-minute series left out; per-day series kept)."""

    def clean(v: float) -> float | None:
        return None if math.isnan(v) or math.isinf(v) else round(v, 6)

    all_history = {r.model: r.ratio for r in a.reuse_all_history}
    return {
        "requests": a.requests,
        "span_days": round((a.end - a.start) / DAY_S, 3),
        "models": {
            "total_tokens": a.ranking.total_tokens,
            "top3_share": clean(a.ranking.top3_share),
            "loglog_slope": clean(a.ranking.slope),
            "loglog_r2": clean(a.ranking.slope_r2),
            "tiers": list(a.ranking.tiers),
            "ranking": [{**m.__dict__, "share": clean(m.share)} for m in a.ranking.models],
        },
        "burstiness": [
            {
                "model": b.model,
                "requests": b.requests,
                "active_minutes": b.active_minutes,
                "mean_tpm": clean(b.mean_tpm),
                "peak_tpm": clean(b.peak_tpm),
                "magnitude": clean(b.magnitude),
                "peak_minute": b.peak_minute,
            }
            for b in a.burstiness
        ],
        "lengths": {
            "all": {k: (clean(v) if isinstance(v, float) else v) for k, v in a.lengths.__dict__.items()},
            "by_model": [
                {k: (clean(v) if isinstance(v, float) else v) for k, v in s.__dict__.items()}
                for s in a.model_lengths
            ],
        },
        "output_ratio": [
            {
                "model": r.model,
                "overall": clean(r.overall),
                "day": r.bucket.tolist(),
                "ratio": [clean(float(v)) for v in r.ratio],
                "p50": [clean(float(v)) for v in r.p50],
            }
            for r in a.output_ratio
        ],
        "prefix_reuse": {
            "window_s": a.window_s,
            "by_model": [
                {
                    "model": r.model,
                    "requests": r.requests,
                    "ratio": clean(r.ratio),
                    "all_history": clean(all_history[r.model]),
                    **(
                        {"day": r.bucket.tolist(), "day_ratio": [clean(float(v)) for v in r.bucket_ratio]}
                        if r.model in a.figures.reuse
                        else {}
                    ),
                }
                for r in a.reuse
            ],
        },
        "latency": {
            s.kind: {
                k: (clean(v) if isinstance(v, float) else v) for k, v in s.__dict__.items() if k != "kind"
            }
            for s in (a.reasoning, a.non_reasoning)
        },
        "figure_models": a.figures.__dict__,
    }


def _html_table(t: Table) -> str:
    align = t.numeric or (False,) * len(t.columns)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if right else ""}">{html.escape(cell)}</td>'
            for cell, right in zip(row, align, strict=False)
        )
        + "</tr>"
        for row in t.rows
    )
    note = f"<p class='note'>{html.escape(t.note)}</p>" if t.note else ""
    return f"<h2>{html.escape(t.title)}</h2><table><tr>{head}</tr>{body}</table>{note}"


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}"
    "th{background:#f3f3f3}.num{text-align:right}.note{color:#555;font-size:13px}img{max-width:100%}"
    "dt{font-weight:600}dd{margin:0 0 .5em 1em}"
)


def html_report(a: TraceAnalysis, pngs: Mapping[str, bytes], title: str, missing_plots: str = "") -> str:
    """One self-contained HTML page: the tables, each followed by its figure(s), then the definitions."""
    figures = dict(pngs)
    parts = [f"<h1>{html.escape(title)}</h1>"]
    span = f"{(a.end - a.start) / DAY_S:.1f} days"
    when = datetime.datetime.fromtimestamp(a.start, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<p>{a.requests:,} requests over {span} from {when}.</p>")
    if missing_plots:
        parts.append(f"<p class='note'>{html.escape(missing_plots)}</p>")
    for t in tables(a):
        parts.append(_html_table(t))
        # Fig. 11 has no table of its own: it follows the burstiness table.
        for name in [t.key, *(("fig11_burstiness_over_time",) if t.key == "fig10_burstiness" else ())]:
            if name in figures:
                data = base64.b64encode(figures[name]).decode("ascii")
                parts.append(f'<p><img alt="{name}" src="data:image/png;base64,{data}"></p>')
    parts.append(
        "<h2>Definitions</h2><dl>"
        + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in DEFINITIONS)
        + "</dl>"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def markdown_table(t: Table) -> str:
    """A table as GitHub Markdown."""
    align = t.numeric or (False,) * len(t.columns)
    lines = [
        "| " + " | ".join(t.columns) + " |",
        "|" + "|".join("---:" if right else "---" for right in align) + "|",
    ]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in t.rows]
    return "\n".join(lines)
