"""Markdown and plots for benchmarks/bprr.py: our numbers next to the paper's Tables 4-6, C.7-C.10 and Figs. 6-9."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from bprr_paper import COLUMNS, FIRST_TOKEN, PER_TOKEN, REMAINING_TOKEN, RUNNING_TIME

from opentela.scheduler.bprr.scenarios import (
    A100,
    MIG,
    SCATTERED_INPUT_OVERHEAD_S,
    SCATTERED_TOKEN_OVERHEAD_S,
    bloom176b,
    clustered_overhead_s,
    roofline_block_times,
)
from opentela.scheduler.bprr.topologies import TABLE3, table3_topology

SYSTEM_LABELS = {
    "petals": "PETALS",
    "opt-order": "Optimized Order",
    "opt-number": "Optimized Number",
    "opt-rr": "Optimized RR",
    "proposed": "Proposed (CG-BP + WS-RR)",
}
FIG_TITLES = {
    "fig6_C": ("Fig. 6: servers C", "C"),
    "fig7_eta": ("Fig. 7: A100 fraction eta", "eta"),
    "fig8_lambda": ("Fig. 8: rate lambda (N_R = 200 lambda)", "lambda (req/s)"),
    "fig9_lmax": ("Fig. 9: output length l_max", "l_max"),
}


def _cell(rows: list[dict[str, Any]], scenario: str, rate: float, lmax: int) -> dict[str, Any]:
    return next(r for r in rows if r["scenario"] == scenario and r["rate"] == rate and r["lmax"] == lmax)


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _reduction(petals: float | None, proposed: float | None) -> float:
    if not petals or proposed is None:
        return math.nan
    return 100 * (1 - proposed / petals)


def _table(
    result: dict[str, Any], mode: str, metric: str, paper: dict[str, dict[str, Any]], digits: int
) -> str:
    """One of Tables 4/5/C.7-C.10: ours, then the paper's MATLAB and experiment values in brackets."""
    rows = result["tables"][mode]
    head = "| scenario | system | " + " | ".join(f"{r} req/s, l_max {n}" for r, n in COLUMNS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(COLUMNS)]
    for scenario in paper:
        for system in ("petals", "proposed"):
            cells = []
            for k, (rate, lmax) in enumerate(COLUMNS):
                ours = _cell(rows, scenario, rate, lmax)[system][metric]
                exp, matlab = paper[scenario][system][k]
                cells.append(f"**{_num(ours, digits)}** ({_num(matlab, digits)} / {_num(exp, digits)})")
            lines.append(f"| {scenario} | {SYSTEM_LABELS[system]} | " + " | ".join(cells) + " |")
        if metric == "per_token_s":
            cells = []
            for k, (rate, lmax) in enumerate(COLUMNS):
                cell = _cell(rows, scenario, rate, lmax)
                ours = _reduction(cell["petals"][metric], cell["proposed"][metric])
                exp = _reduction(paper[scenario]["petals"][k][0], paper[scenario]["proposed"][k][0])
                matlab = _reduction(paper[scenario]["petals"][k][1], paper[scenario]["proposed"][k][1])
                cells.append(f"**{ours:.0f} %** ({matlab:.0f} % / {exp:.0f} %)")
            lines.append(f"| {scenario} | reduction | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _reductions(result: dict[str, Any], mode: str) -> list[float]:
    return [
        _reduction(r["petals"]["per_token_s"], r["proposed"]["per_token_s"]) for r in result["tables"][mode]
    ]


def _ratio_stats(result: dict[str, Any], metric: str, paper: dict[str, dict[str, Any]], which: int) -> str:
    """Median and range of ours / paper over all Table 4-5 cells (which: 0 experiment, 1 MATLAB)."""
    ratios = []
    for scenario in paper:
        for system in ("petals", "proposed"):
            for k, (rate, lmax) in enumerate(COLUMNS):
                ours = _cell(result["tables"]["calibrated"], scenario, rate, lmax)[system][metric]
                ratios.append(ours / paper[scenario][system][k][which])
    ratios.sort()
    return f"median {ratios[len(ratios) // 2]:.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}"


def _span(
    result: dict[str, Any],
    paper: dict[str, dict[str, Any]],
    scenarios: Iterable[str],
    system: str,
    metric: str,
    columns: Iterable[tuple[float, int]] = COLUMNS,
) -> tuple[str, str, str]:
    """(ours, paper MATLAB, paper experiment) ranges of `metric` over some Table 4-5 cells (calibrated mode)."""
    ours, matlab, exp = [], [], []
    for scenario in scenarios:
        for rate, lmax in columns:
            k = COLUMNS.index((rate, lmax))
            ours.append(_cell(result["tables"]["calibrated"], scenario, rate, lmax)[system][metric])
            exp.append(paper[scenario][system][k][0])
            matlab.append(paper[scenario][system][k][1])
    digits = 0 if max(ours) > 20 else 2

    def span(v: list[float]) -> str:
        return f"{min(v):.{digits}f}-{max(v):.{digits}f}"

    return span(ours), span(matlab), span(exp)


def _stand_ins() -> str:
    lines = [
        "| network | nodes | links (directed) | link delay, ms | stand-in: median / max RTT between nodes, ms |",
        "|---|---:|---:|---|---|",
    ]
    for name, spec in TABLE3.items():
        topo = table3_topology(name)
        d = topo.delays() * 1e3
        rtt = topo.rtt_s[~np.eye(topo.n_nodes, dtype=bool)] * 1e3
        lines.append(
            f"| {name} | {topo.n_nodes} (paper {spec.n_nodes}) | {topo.n_links} (paper {spec.n_links}) | "
            f"[{d.min():.3f}, {d.max():.3f}] (paper [{spec.min_delay_s * 1e3:.3f}, {spec.max_delay_s * 1e3:.3f}]) | "
            f"{float(np.median(rtt)):.2f} / {rtt.max():.2f} |"
        )
    return "\n".join(lines)


def _sweep_rows(sweeps: dict[str, Any]) -> Iterable[str]:
    for fig, by_topo in sweeps.items():
        title, xlabel = FIG_TITLES[fig]
        yield f"\n**{title}** (per-token time, s)\n"
        yield "| topology | " + xlabel + " | " + " | ".join(SYSTEM_LABELS[s] for s in SYSTEM_LABELS) + " |"
        yield "|---|---:|" + "---:|" * len(SYSTEM_LABELS)
        for topo, rows in by_topo.items():
            for row in rows:
                cells = " | ".join(_num(row[s]["per_token_s"]) for s in SYSTEM_LABELS)
                yield f"| {topo} | {row['x']:g} | {cells} |"


def _sweep_points(sweeps: dict[str, Any]) -> list[tuple[str, str, float, dict[str, float]]]:
    """(figure, topology, x, per-token time by system) for every sweep point where every system could serve."""
    out = []
    for fig, by_topo in sweeps.items():
        for topo, rows in by_topo.items():
            for row in rows:
                times = {sys: row[sys]["per_token_s"] for sys in SYSTEM_LABELS}
                if all(t is not None for t in times.values()):
                    out.append((fig, topo, row["x"], times))
    return out


def _claims(all_sweeps: dict[str, Any]) -> dict[str, str]:
    """The paper's Section 4.3 statements, counted on our sweeps per mode."""
    facts: dict[str, str] = {}
    for mode, sweeps in all_sweeps.items():
        pts = _sweep_points(sweeps)
        n = len(pts)
        best = sum(t["proposed"] <= min(t.values()) + 1e-9 for *_, t in pts)
        not_best = [
            f"{f[:4]} {topo} {x:g}: {t['proposed']:.2f} vs {min(t.values()):.2f}"
            for f, topo, x, t in pts
            if t["proposed"] > min(t.values()) + 1e-9
        ]
        number = sum(t["opt-number"] < t["petals"] - 1e-9 for *_, t in pts)
        order = [f"{f[:4]} {topo} {x:g}" for f, topo, x, t in pts if t["opt-order"] > t["petals"] + 1e-9]
        rr = [f"{f[:4]} {topo} {x:g}" for f, topo, x, t in pts if t["opt-rr"] > t["petals"] + 1e-9]
        rr_better = sum(t["opt-rr"] < t["petals"] - 1e-9 for *_, t in pts)
        widen = []
        for fig, lo_is_tight in (("fig6_C", True), ("fig7_eta", True), ("fig8_lambda", False)):
            for rows in sweeps.get(fig, {}).values():
                red = [_reduction(r["petals"]["per_token_s"], r["proposed"]["per_token_s"]) for r in rows]
                tight, loose = (red[0], red[-1]) if lo_is_tight else (red[-1], red[0])
                widen.append(tight >= loose - 0.5)
        facts[f"{mode}_points"] = str(n)
        facts[f"{mode}_best"] = str(best) + (
            f" (elsewhere: {'; '.join(not_best[:5])}{'; ...' if len(not_best) > 5 else ''})"
            if not_best
            else ""
        )
        facts[f"{mode}_number"] = str(number)
        facts[f"{mode}_order_worse"] = f"{len(order)}" + (
            f" ({', '.join(order[:4])}{', ...' if len(order) > 4 else ''})" if order else ""
        )
        facts[f"{mode}_rr_worse"] = f"{len(rr)}" + (
            f" ({', '.join(rr[:4])}{', ...' if len(rr) > 4 else ''})" if rr else ""
        )
        facts[f"{mode}_rr_better"] = str(rr_better)
        facts[f"{mode}_widen"] = f"{sum(widen)} of {len(widen)}"
    return facts


def _plot_tables(result: dict[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for system, colour in (("petals", "tab:red"), ("proposed", "tab:blue")):
        for which, marker, label in ((1, "o", "paper MATLAB"), (0, "x", "paper experiment")):
            xs, ys = [], []
            for scenario in PER_TOKEN:
                for k, (rate, lmax) in enumerate(COLUMNS):
                    xs.append(PER_TOKEN[scenario][system][k][which])
                    ys.append(
                        _cell(result["tables"]["calibrated"], scenario, rate, lmax)[system]["per_token_s"]
                    )
            left.scatter(xs, ys, marker=marker, color=colour, label=f"{SYSTEM_LABELS[system]} vs {label}")
    top = 9.0
    left.plot([0, top], [0, top], "k--", lw=1)
    left.set(xlabel="paper, s/token", ylabel="ours (calibrated), s/token", title="Tables 4-5: per-token time")
    left.legend(fontsize=7)
    labels = [f"{r['scenario']}\n{r['rate']}/{r['lmax']}" for r in result["tables"]["calibrated"]]
    x = range(len(labels))
    right.bar([i - 0.2 for i in x], _reductions(result, "calibrated"), 0.4, label="ours, calibrated")
    right.bar([i + 0.2 for i in x], _reductions(result, "model"), 0.4, label="ours, model only")
    paper_red = [
        _reduction(PER_TOKEN[r["scenario"]]["petals"][k][0], PER_TOKEN[r["scenario"]]["proposed"][k][0])
        for r in result["tables"]["calibrated"]
        for k, col in enumerate(COLUMNS)
        if col == (r["rate"], r["lmax"])
    ]
    right.scatter(list(x), paper_red, color="k", marker="_", s=200, label="paper experiment", zorder=3)
    right.set_xticks(list(x), labels, rotation=90, fontsize=6)
    right.set(ylabel="per-token time reduction vs PETALS, %", title="Reduction by the proposed system")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_sweeps(sweeps: dict[str, Any], mode: str, path: Path) -> None:
    topos = list(TABLE3)
    fig, axes = plt.subplots(len(sweeps), len(topos), figsize=(13, 3.2 * len(sweeps)), squeeze=False)
    for i, (fig_name, by_topo) in enumerate(sweeps.items()):
        title, xlabel = FIG_TITLES[fig_name]
        for j, topo in enumerate(topos):
            ax = axes[i][j]
            rows = by_topo.get(topo, [])
            for system, label in SYSTEM_LABELS.items():
                ys = [r[system]["per_token_s"] for r in rows]
                ax.plot(
                    [r["x"] for r in rows],
                    [math.nan if y is None else y for y in ys],
                    marker="o",
                    label=label,
                )
            ax.set(title=f"{title} - {topo} ({mode})", xlabel=xlabel, ylabel="s/token")
            ax.title.set_fontsize(9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(result: dict[str, Any], out: Path) -> None:
    """Write bprr.md and bprr_tables.png / bprr_sweeps.png under `out`."""
    _plot_tables(result, out / "bprr_tables.png")
    for mode, sweeps in result["sweeps"].items():
        _plot_sweeps(
            sweeps, mode, out / ("bprr_sweeps.png" if mode == "calibrated" else f"bprr_sweeps_{mode}.png")
        )
    (out / "bprr.md").write_text(render(result) + "\n")


def render(result: dict[str, Any]) -> str:
    """The Markdown summary."""
    from bprr_text import DISCUSSION, SETUP

    s = result["settings"]
    model = bloom176b(128)
    cal, mod = _reductions(result, "calibrated"), _reductions(result, "model")
    roof = roofline_block_times()
    big_mod = [
        _reduction(r["petals"]["per_token_s"], r["proposed"]["per_token_s"])
        for r in result["tables"]["model"]
        if r["scenario"] in ("BellCanada", "GTS-CE")
    ]
    facts: dict[str, Any] = {
        "runs": s["runs"],
        "sweep_runs": s["sweep_runs"],
        "elapsed": result["elapsed_s"]["total"],
        "workers": result["machine"]["workers"],
        "s_m": model.block_bytes / 1e9,
        "s_c64": bloom176b(64).cache_bytes / 1e6,
        "s_c128": model.cache_bytes / 1e6,
        "a100_mem": A100.memory_bytes / 1e9,
        "mig_mem": MIG.memory_bytes / 1e9,
        "a100_tau": A100.tau_decode_s * 1e3,
        "a100_taui": A100.tau_prefill_s * 1e3,
        "mig_tau": MIG.tau_decode_s * 1e3,
        "mig_taui": MIG.tau_prefill_s * 1e3,
        "overhead": SCATTERED_TOKEN_OVERHEAD_S * 1e3,
        "input_overhead": SCATTERED_INPUT_OVERHEAD_S * 1e3,
        "cluster_overhead": clustered_overhead_s(model) * 1e3,
        "roof_a100": roof["A100-80G"][0] * 1e3,
        "roof_a100_i": roof["A100-80G"][1] * 1e3,
        "roof_mig": roof["A100-MIG-1g.10gb"][0] * 1e3,
        "stand_ins": _stand_ins(),
        "cal_lo": min(cal),
        "cal_hi": max(cal),
        "mod_lo": min(mod),
        "mod_hi": max(mod),
        "mod_big": f"{min(big_mod):.0f}-{max(big_mod):.0f}",
        "vs_matlab": _ratio_stats(result, "per_token_s", PER_TOKEN, 1),
        "vs_exp": _ratio_stats(result, "per_token_s", PER_TOKEN, 0),
        "first_vs_matlab": _ratio_stats(result, "first_token_s", FIRST_TOKEN, 1),
        "rest_vs_matlab": _ratio_stats(result, "remaining_token_s", REMAINING_TOKEN, 1),
    }
    clusters, big = ("Cluster0", "Cluster1", "Cluster2"), ("BellCanada", "GTS-CE")
    for key, args in {
        "pf_cl": (FIRST_TOKEN, clusters, "petals", "first_token_s", [(0.5, 128)]),
        "pf_big": (FIRST_TOKEN, big, "petals", "first_token_s", COLUMNS),
        "qr": (REMAINING_TOKEN, PER_TOKEN, "proposed", "remaining_token_s", COLUMNS),
        "pr_cl": (REMAINING_TOKEN, clusters, "petals", "remaining_token_s", COLUMNS),
        "pt_big": (PER_TOKEN, big, "petals", "per_token_s", COLUMNS),
        "qt": (PER_TOKEN, PER_TOKEN, "proposed", "per_token_s", COLUMNS),
    }.items():
        facts[key], facts[key + "_m"], facts[key + "_e"] = _span(result, *args)
    parts = [SETUP.format(**facts)]
    parts.append("## Tables 4 and 5: per-token time over all tokens (calibrated mode)\n")
    parts.append("Ours in bold, then (paper MATLAB / paper experiment); seconds per token.\n")
    parts.append(_table(result, "calibrated", "per_token_s", PER_TOKEN, 2))
    parts.append("\n## Tables C.7-C.10: first token and each remaining token (calibrated mode)\n")
    parts.append(_table(result, "calibrated", "first_token_s", FIRST_TOKEN, 1))
    parts.append("")
    parts.append(_table(result, "calibrated", "remaining_token_s", REMAINING_TOKEN, 2))
    parts.append("\n## The same runs without the setup constants (model mode)\n")
    parts.append(
        "Eq. (1) plus waiting only; the paper's values in brackets are for reference, they include setup.\n"
    )
    parts.append(_table(result, "model", "per_token_s", PER_TOKEN, 2))
    parts.append("\n## Table 6: running time (s), placement plus 100 routing decisions\n")
    parts.append(
        "| scenario | PETALS ours | PETALS paper | proposed ours | proposed paper |\n|---|---:|---:|---:|---:|"
    )
    for group, d in result["running_time"].items():
        p, q = d["petals"], d["proposed"]
        pp, pq = RUNNING_TIME[group]["petals"], RUNNING_TIME[group]["proposed"]
        parts.append(
            f"| {group} | {p[0]:.4f} +- {p[1]:.4f} | {pp[0]:.4f} +- {pp[1]:.4f} | "
            f"{q[0]:.4f} +- {q[1]:.4f} | {pq[0]:.4f} +- {pq[1]:.4f} |"
        )
    for mode, sweeps in result["sweeps"].items():
        png = "bprr_sweeps.png" if mode == "calibrated" else f"bprr_sweeps_{mode}.png"
        parts.append(f"\n## Figs. 6-9: sweeps with the ablations ({mode} mode)\n")
        parts.append(f"![sweeps, {mode} mode]({png})")
        parts.extend(_sweep_rows(sweeps))
    facts.update(_claims(result["sweeps"]))
    parts.append(DISCUSSION.format(**facts))
    return "\n".join(parts)
