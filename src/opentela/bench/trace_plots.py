"""The figures of a trace analysis, one PNG per figure of the paper's section 6.2 (Matplotlib, optional)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opentela.bench.trace_analysis import DAY_S, TraceAnalysis, TraceColumns, ecdf
from opentela.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURES: dict[str, str] = {
    "fig09_model_tokens": "Fig. 9: tokens per model, ranked",
    "fig10_burstiness": "Fig. 10: peak-to-average TPM over active minutes",
    "fig11_burstiness_over_time": "Fig. 11: burstiness over time from each model's first request",
    "fig12_lengths": "Fig. 12: input and output length CDFs",
    "fig13_output_ratio": "Fig. 13: output token ratio per day",
    "fig14_prefix_reuse": "Fig. 14: reusable prefix ratio over each model's lifecycle",
    "fig15_reasoning": "Fig. 15: E2E latency and output length, reasoning vs not",
}
"""File stem and title of each figure, in the paper's order."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("the trace plots need Matplotlib: pip install 'opentela[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def render(cols: TraceColumns, analysis: TraceAnalysis) -> dict[str, bytes]:
    """Every figure as PNG bytes, keyed by its `FIGURES` name."""
    plt = _pyplot()
    draw: dict[str, Callable[[Any, TraceColumns, TraceAnalysis], Figure]] = {
        "fig09_model_tokens": _ranking,
        "fig10_burstiness": _magnitude,
        "fig11_burstiness_over_time": _over_time,
        "fig12_lengths": _lengths,
        "fig13_output_ratio": _ratio,
        "fig14_prefix_reuse": _reuse,
        "fig15_reasoning": _reasoning,
    }
    out = {}
    for name, fn in draw.items():
        fig = fn(plt, cols, analysis)
        fig.suptitle(FIGURES[name])
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        out[name] = buf.getvalue()
    return out


def write(pngs: dict[str, bytes], folder: Path, prefix: str = "") -> list[Path]:
    """Write the PNGs of `render` into `folder` as `<prefix><name>.png`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in pngs.items():
        path = folder / f"{prefix}{name}.png"
        path.write_bytes(data)
        paths.append(path)
    return paths


def _empty(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _ranking(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    top = a.ranking.models[:20]
    edges = np.cumsum(a.ranking.tiers)
    tier = [int(np.searchsorted(edges, i, side="right")) for i in range(len(top))]
    colours = [("tab:red", "tab:orange", "tab:blue", "tab:grey")[min(t, 3)] for t in tier]
    ax.bar(range(len(top)), [m.tokens for m in top], color=colours)
    ax.set_yscale("log")
    ax.set_xticks(range(len(top)), [m.model for m in top], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("input + output tokens")
    ax.text(
        0.98,
        0.95,
        f"top 3: {a.ranking.top3_share:.0%} of tokens\nlog-log slope {a.ranking.slope:.2f} "
        f"(R² {a.ranking.slope_r2:.2f})\ntiers {'/'.join(str(t) for t in a.ranking.tiers)} models",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
    )
    return fig


def _magnitude(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    top = a.burstiness[:15][::-1]
    ax.barh([b.model for b in top], [b.magnitude for b in top], color="tab:purple")
    ax.set_xlabel("burstiness magnitude: peak TPM / mean TPM over active minutes")
    ax.tick_params(axis="y", labelsize=7)
    return fig


def _over_time(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    chosen = [b for m in a.figures.burst for b in a.burstiness if b.model == m]
    fig, axes = plt.subplots(
        max(len(chosen), 1), 1, figsize=(10, 1.7 * max(len(chosen), 1) + 0.6), squeeze=False
    )
    for ax, b in zip(axes[:, 0], chosen, strict=False):
        ax.vlines(b.minutes / 1440.0, 0, b.burstiness, lw=0.6, color="tab:blue")
        ax.set_ylabel("TPM / mean", fontsize=7)
        ax.set_title(f"{b.model} (peak {b.magnitude:.0f})", fontsize=8, loc="left")
    if not chosen:
        _empty(axes[0, 0], "no model chosen")
    axes[-1, 0].set_xlabel("days since the model's first request")
    return fig


def _lengths(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, values, agg, label in (
        (left, cols.input_tokens, (a.lengths.input_p50, a.lengths.input_p95, a.lengths.input_p99), "input"),
        (
            right,
            cols.output_tokens,
            (a.lengths.output_p50, a.lengths.output_p95, a.lengths.output_p99),
            "output",
        ),
    ):
        for model in a.figures.lengths:
            x, f = ecdf(values[cols.model == cols.code(model)])
            ax.step(np.maximum(x, 1), f, where="post", label=model)
        for q, v in zip(("P50", "P95", "P99"), agg, strict=True):
            ax.axvline(max(v, 1), ls=":", color="grey")
            ax.text(max(v, 1), 0.02, f" {q}", fontsize=7, color="grey", rotation=90)
        ax.set_xscale("log")
        ax.set(xlabel=f"{label} tokens", ylabel="CDF", ylim=(0, 1.01))
        ax.grid(alpha=0.3)
    right.legend(fontsize=7, loc="lower right")
    return fig


def _ratio(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, ax = plt.subplots(figsize=(10, 3.8))
    for series in a.output_ratio:
        day = series.bucket * series.bucket_s / DAY_S
        ax.fill_between(day, series.p25, series.p75, alpha=0.25, step="mid")
        ax.plot(day, series.ratio, lw=1.2, label=f"{series.model}: output / (input + output) tokens")
        ax.plot(day, series.p50, lw=0.8, ls="--", label=f"{series.model}: per-request median (band: P25-P75)")
    if not a.output_ratio:
        _empty(ax, "no model chosen")
    ax.set(xlabel="day of the trace", ylabel="output token ratio", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def _reuse(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, ax = plt.subplots(figsize=(10, 3.8))
    chosen = [r for m in a.figures.reuse for r in a.reuse if r.model == m]
    for r in chosen:
        ax.plot(r.bucket * r.bucket_s / DAY_S, r.bucket_ratio, marker=".", label=f"{r.model} ({r.ratio:.0%})")
    if not chosen:
        _empty(ax, "no request carries prefix hashes")
    window = "all history" if a.window_s is None else f"the previous {a.window_s / 3600:g} h"
    ax.set(
        xlabel="days since the model's first request", ylabel=f"reusable prefix ratio ({window})", ylim=(0, 1)
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    return fig


def _reasoning(plt: Any, cols: TraceColumns, a: TraceAnalysis) -> Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for flag, stats in ((1, a.reasoning), (0, a.non_reasoning)):
        sel = cols.reasoning == flag
        e2e = cols.e2e_s[sel]
        e2e = e2e[~np.isnan(e2e)]
        for ax, values, p50, p95 in (
            (left, e2e, stats.e2e_p50, stats.e2e_p95),
            (right, cols.output_tokens[sel], stats.output_p50, stats.output_p95),
        ):
            if values.size:
                x, f = ecdf(values)
                (line,) = ax.step(
                    np.maximum(x, 1e-3),
                    f,
                    where="post",
                    label=f"{stats.kind} (P50 {p50:,.4g}, P95 {p95:,.4g})",
                )
                ax.plot([p50, p95], [0.5, 0.95], "o", color=line.get_color(), ms=4)
    left.set(xlabel="end-to-end latency (s)", ylabel="CDF")
    right.set(xlabel="output tokens", ylabel="CDF")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return fig
