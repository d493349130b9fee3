"""Markdown and plots for benchmarks/raidserve.py: our simulated figures next to the paper's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {"standard": "Standard TP", "nonuniform": "Non-uniform TP", "raidserve": "RaidServe"}
MATCH_AND_MISS = """## What we match, what we miss, and why

- **Configurations**: both of the paper's Fig. 9 tables exactly, and the minimum GPU counts (3 and 5).
- **Throughput under failures**: the order (RaidServe > Non-uniform > Standard) and its growth with the failure
  rate match; the size depends on the availability trace, which the paper does not publish. On the GCP-like
  stand-in (93.7 % of GPUs available) RaidServe is 1.14x Standard TP for Llama and 1.51x for Mixtral (paper
  1.28x and 1.71x) and reaches 95 % / 94 % of the fault-scaled bound (paper 95 % / 92 %); the harsher stand-in
  (80.8 %) gives 1.26x for Llama, near the paper, and 3.16x for Mixtral, where Standard TP loses every node
  with fewer than 8 GPUs. A node sits at 5-7 GPUs more often in the paper's trace than in our GCP-like one.
- **Balancing on 7 GPUs**: cyclic placement (memory balancing) adds 29 % over Non-uniform TP7 for Llama (paper
  +34 %); hybrid attention a further 8 % (paper +43 %). Our gain from compute balancing is smaller because the
  simulated decode step is memory-bound at these batches, so an extra head on one rank costs its extra KV and
  weight reads, which cyclic placement already spreads, more than its compute.
- **Alg. 1 and load-aware routing cost 6 % here** (5,262 against 5,589 tokens/s for round robin with FIFO
  chunks, and below Non-uniform TP on 3 and 5 GPUs): in this offline, memory-bound setting the replica keeps
  preempting and recomputing requests, and spreading each step's prompt budget over the ranks keeps several
  large recomputations half-done at once instead of finishing one. The paper measures its scheduler on the
  Mooncake trace's long prompts, where one prompt per step starves the other ranks; that online experiment
  (Fig. 10-11) is not reproduced yet.
- **Latency through a failure**: the paper's ordering holds (P99 of the max time between tokens: recompute
  11.5 s, host backup 292 ms, on-demand weights 120 ms; paper > 10 s, 572 ms, 229 ms). Our recompute P90 is
  0.9 s where the paper's exceeds 10 s: at 4 requests per second only about 32 requests are in flight at the
  failure, so fewer requests wait behind the re-prefill than in the paper's window.
- **Recovery**: the on-demand PCIe bytes per survivor (7.8 GB, paper's estimate 7.5 GB) and the ordering
  recompute >> host backup > on-demand weights match; our times (32 s / 329 ms / 157 ms) are model estimates
  at the full link rates, where the paper's (22 s / 530 ms / 120 ms) are measurements on its own trace window.
"""


def _tput(doc: dict[str, Any], model: str, mode: str, gpus: int, variant: str = "default") -> float:
    return next(
        r["tok_s"]
        for r in doc["offline"]
        if (r["model"], r["mode"], r["gpus"], r["variant"]) == (model, mode, gpus, variant)
    )


def plots(doc: dict[str, Any], curves: dict[str, Any], out: Path) -> None:
    """raidserve_trace.png (throughput over the gcp-like trace) and raidserve_configs.png (tok/s per GPU count)."""
    models = list(doc["paper"])
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 3.2 * len(models)), sharex=True)
    scenario = "gcp-like"
    for ax, model in zip(np.atleast_1d(axes), models, strict=True):
        for mode, series in curves[scenario][model].items():
            values = np.asarray(series) / 1000
            ax.plot(np.arange(len(values)) / 60, values, label=LABELS[mode], lw=0.9)
            ax.axhline(values.mean(), ls="--", lw=0.7, color=ax.lines[-1].get_color())
        row = doc["availability"][scenario][model]
        ax.axhline(
            row["fault_scaled_tok_s"] / 1000, color="grey", lw=0.7, ls=":", label="Fault-scaled (mean)"
        )
        ax.set_title(f"{model}: 8 x 8 H100, synthetic GCP-like availability")
        ax.set_ylabel("k tokens/s")
        ax.legend(fontsize=7, loc="lower left")
    np.atleast_1d(axes)[-1].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(out / "raidserve_trace.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(models), figsize=(11, 3.6))
    for ax, model in zip(np.atleast_1d(axes), models, strict=True):
        gpus = np.arange(1, 9)
        for k, mode in enumerate(LABELS):
            ax.bar(
                gpus + (k - 1) * 0.27,
                [_tput(doc, model, mode, int(g)) / 1000 for g in gpus],
                0.27,
                label=LABELS[mode],
            )
        ax.set_title(model)
        ax.set_xlabel("GPUs available on the node")
        ax.set_ylabel("offline k tokens/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "raidserve_configs.png", dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """The summary page."""
    s = doc["settings"]
    models = list(doc["paper"])
    lines = [
        "# RaidServe in the simulator: Standard TP, Non-uniform TP and RaidServe under GPU failures",
        "",
        f"`python benchmarks/raidserve.py` ({s['requests']} requests per configuration, tokens counted over "
        f"[{s['window_s']:.0f}, {2 * s['window_s']:.0f}] s of simulated time, a {s['hours']:.0f}-hour trace; the run "
        f"took {doc['run_s']:.0f} s on {doc['machine']['cpus']} CPUs). Raw numbers: `raidserve.json`. Everything here "
        "is simulated on H100-SXM figures (`scheduler/raidserve`: the planner, `LayoutCost` per-rank roofline step "
        "times where the slowest rank of each layer sets the pace, and `ReplicaSim` continuous batching with "
        "per-rank KV memory, load-aware DP routing and Alg. 1 chunked prefill); no GPU was used. The paper's "
        "numbers are quoted beside ours.",
        "",
        "## Configurations (the paper's Fig. 9 tables)",
        "",
        "GPUs each system runs on when a node has 1-8 left: the weights and one request of 125,192 tokens (the "
        "longest of the paper's Mooncake sample) must fit, with 90 % of memory usable and 1 GiB kept for "
        "activations.",
        "",
    ]
    for model in models:
        table = doc["configs"][model]["table"]
        lines += [f"**{model}**", "", "| available GPUs | " + " | ".join(str(g) for g in range(1, 9)) + " |"]
        lines.append("|---|" + "---:|" * 8)
        for mode, row in table.items():
            lines.append(
                f"| {LABELS[mode]} | " + " | ".join("-" if x is None else str(x) for x in row) + " |"
            )
        lines.append("")
    lines += [
        "Both tables equal the paper's: Llama-3.1-70B needs 3 GPUs and Mixtral-8x22B 5 with non-uniform TP; "
        "Standard TP falls back to TP4 from 4-7 GPUs for Llama and cannot serve Mixtral below 8.",
        "",
        "## Offline throughput per configuration",
        "",
        "Every request present at once, up to 1,024 sequences per batch (so KV memory limits the batch); input and "
        "output lengths from a synthetic stand-in for OpenThoughts-114k: "
        "log-normal fitted to the paper's Table 1 (input mean 422 / median 352 / max 7,633; output mean 7,295 / "
        "median 5,583 / max 37,817). RaidServe routes by least pending DP work and chunks prompts by Alg. 1; the "
        "others route round robin with FIFO chunks (routing changes nothing for them: they replicate no head).",
        "",
        "![tokens/s per GPU count](raidserve_configs.png)",
        "",
        "| model | GPUs | Standard TP | Non-uniform TP | RaidServe |",
        "|---|---:|---:|---:|---:|",
    ]
    for model in models:
        for g in range(1, 9):
            vals = [_tput(doc, model, m, g) for m in LABELS]
            if any(vals):
                lines.append(
                    f"| {model} | {g} | " + " | ".join(f"{v:,.0f}" if v else "-" for v in vals) + " |"
                )
    lines += ["", "## Throughput under GPU failures (the paper's Fig. 9 experiment)", ""]
    lines += [
        "Eight 8-GPU nodes; every GPU fails and comes back independently (exponential times; rates per scenario "
        "below), each node serving at its configuration's offline throughput and stopping for 10 s at every event "
        "(the paper's fixed reconfiguration time). The paper replays the GCP availability trace of Bamboo, Oobleck "
        "and Recycle, scaled to 64 GPUs, which it shows only as a plot (Fig. 6); our traces are synthetic stand-ins, "
        "so the ratios depend on how often nodes sit at 5-7 GPUs, and three scenarios are shown.",
        "",
        "| scenario | GPU failures / GPU-hour | mean repair | availability | model | RaidServe / Standard | "
        "RaidServe / Non-uniform | RaidServe / Fault-scaled |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, sc in doc["availability"].items():
        for model in models:
            row, paper = sc[model], doc["paper"][model]
            lines.append(
                f"| {name} | {sc['fail_per_gpu_hour']} | {sc['repair_hours']} h | {sc['availability']:.1%} | {model} | "
                f"**{row['raidserve_vs_standard']:.2f}x** ({paper['vs_standard']}x) | "
                f"**{row['raidserve_vs_nonuniform']:.2f}x** ({paper['vs_nonuniform']}x) | "
                f"**{row['raidserve_of_fault_scaled']:.0%}** ({paper['of_fault_scaled']:.0%}) |"
            )
    lines += [
        "",
        "Ours in bold, the paper's in brackets.",
        "",
        "![throughput over the trace](raidserve_trace.png)",
        "",
    ]
    lines += ["## Memory and compute balancing on 7 GPUs (the paper's Fig. 12, decode)", ""]
    lines += [
        "| model | Standard TP4 | Non-uniform TP7 | + cyclic placement | RaidServe TP7 (+ hybrid attention) | "
        "RaidServe, round robin + FIFO chunks |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for model in models:
        base = _tput(doc, model, "standard", 7)
        vals = [
            _tput(doc, model, "nonuniform", 7),
            _tput(doc, model, "nonuniform", 7, "cyclic"),
            _tput(doc, model, "raidserve", 7),
            _tput(doc, model, "raidserve", 7, "unbalanced-routing"),
        ]
        cell = [f"{base:,.0f}" if base else "-"] + [
            f"{v:,.0f}" + (f" ({v / base:.2f}x)" if base else "") for v in vals
        ]
        lines.append(f"| {model} | " + " | ".join(cell) + " |")
    r = doc["recovery"]
    t, paper = r["times_s"], r["paper_s"]
    lines += [
        "",
        "The paper's Fig. 12 (Llama, decode): memory balancing +34 % over Non-uniform TP7, compute balancing a "
        "further +43 %; Fig. 10: 2x over TP4 and 1.60x over Non-uniform TP7 under a 40 ms TBT bound.",
        "",
        "## Recovery (the paper's Table 3)",
        "",
        "Llama-3.1-70B on 8 H100s, one GPU lost with 56 requests of 16K tokens in flight (the paper's section 3.2 "
        "example; its Table 3 measured a 500-request Mooncake window, whose batch at the failure it does not give). "
        "PCIe 50 GB/s per GPU, NVLink 450 GB/s per direction; a survivor's PCIe and NVLink transfers overlap.",
        "",
        "| | Recompute | Host (KV backup, weights re-sharded) | Full (KV backup, weights on demand) |",
        "|---|---:|---:|---:|",
        f"| ours | {t['recompute']:.1f} s | {t['host'] * 1000:.0f} ms | {t['full'] * 1000:.0f} ms |",
        f"| paper | {paper['recompute']:.0f} s | {paper['host'] * 1000:.0f} ms | {paper['full'] * 1000:.0f} ms |",
        "",
        f"Each survivor reads {min(r['per_survivor_pcie_gb']):.2f}-{max(r['per_survivor_pcie_gb']):.2f} GB over PCIe "
        f"on demand (the paper estimates 7.5 GB) against {min(r['naive_weights_gb']):.1f}-"
        f"{max(r['naive_weights_gb']):.1f} GB of weights alone for a naive re-shard; recompute is "
        f"{t['prefill']:.1f} s of re-prefill on 7 GPUs plus the re-shard.",
        "",
        "## Latency through a failure (the paper's Fig. 13)",
        "",
        "A RaidServe TP8 decode instance of Llama-3.1-70B (prompts arrive with their cache computed, as behind a "
        "prefill instance) serves 500 requests of a synthetic stand-in for the paper's Mooncake sample (input "
        "log-normal with its mean 13,516 and median 8,001 tokens, at most 123,192; output normal around its mean "
        "349, at most 2,000) arriving at 4 per second; GPU 3 fails 100 ms after the 250th arrives. The "
        "recovery's downtime comes from the plan above for the caches then in flight; with Recompute the caches "
        "are lost and the simulator re-prefills them. Max time between tokens per request:",
        "",
        "| method | in flight | downtime | P50 | P90 | P99 | paper P90 / P99 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    paper_tbt = {
        "none": "",
        "recompute": "> 10 s / > 10 s",
        "host": "< 1 s / 572 ms",
        "full": "< 1 s / 229 ms",
    }
    for run in doc["online_recovery"]:
        q = run["max_tbt_ms"]
        lines.append(
            f"| {run['method']} | {run['inflight_requests']} ({run['inflight_tokens']:,} tokens) | "
            f"{run['downtime_ms']:,.0f} ms | {q['50']:,.0f} ms | {q['90']:,.0f} ms | {q['99']:,.0f} ms | "
            f"{paper_tbt[run['method']]} |"
        )
    lines += [
        "",
        MATCH_AND_MISS,
    ]
    return "\n".join(lines)
