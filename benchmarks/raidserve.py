"""RaidServe's evaluation in our simulator: configurations, throughput under GPU failures, balancing, recovery.

Reproduces, for Llama-3.1-70B-Instruct and Mixtral-8x22B on 8 x 8 H100s (`papers/raidserve.txt` section 4):

1. Fig. 9's tables: the TP configuration each system runs with 1-8 GPUs left on a node (weights plus the longest
   request of the paper's Mooncake sample, 125,192 tokens, must fit).
2. Offline throughput per configuration: `ReplicaSim` with every request present at t = 0, lengths from a
   synthetic stand-in for OpenThoughts-114k (log-normal input and output lengths fitted to the means and medians
   of the paper's Table 1, clipped at its maxima), tokens per second over a window after warm-up.
3. Fig. 9's experiment: eight 8-GPU nodes under a GPU availability trace; each node serves at the throughput of
   the configuration its available GPUs allow, with 10 s of reconfiguration after every event (the paper's
   figure); Fault-scaled is the fault-free throughput times the available share. The GCP availability trace
   (Fig. 6) is not published as numbers, so the trace is a synthetic stand-in: every GPU fails and returns as an
   on/off process, with failure and repair rates chosen per scenario and stated in the output.
4. Fig. 12's ablation on 7 GPUs: Non-uniform TP, + cyclic placement (memory balancing), RaidServe (hybrid
   attention: compute balancing), against Standard TP4.
5. Table 3: recovery of Llama-3.1-70B from TP8 to 7 GPUs with 56 requests of 16K tokens in flight (the paper's
   section 3.2 example): recompute, KV from the host backup, and on-demand weights.

Prints JSON and writes docs/benchmarks/raidserve.{json,md} and raidserve_*.png.

    python benchmarks/raidserve.py [--quick] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.raidserve import MODES, minimum_devices, plan_layout, plan_recovery
from opentela.scheduler.raidserve.replica_sim import ReplicaSim
from opentela.scheduler.simulator import EngineLimits

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Llama-3.1-70B-Instruct", "Mixtral-8x22B-v0.1")
DEVICE = "H100-SXM"
LONGEST = 125_192
"""The longest request of the paper's Mooncake sample (Table 2): 123,192 input + 2,000 output tokens."""
OPENTHOUGHTS = {"input": (422, 352, 7633), "output": (7295, 5583, 37817)}
"""Table 1 of the paper: mean, median and maximum tokens."""
MOONCAKE = {"input": (13516, 8001, 123192), "output": (349, 362, 2000)}
"""Table 2 of the paper (its 3,000-request Mooncake sample): mean, median and maximum tokens."""
ONLINE_RATE = 4.0
"""Requests per second at the decode instance of the recovery experiment (about 33 in flight at the failure)."""
RECONFIGURE_S = 10.0
MAX_SEQS = 1024
"""Sequences per batch: high enough that KV memory, which the systems differ in, is what limits the batch."""
NODES, GPUS = 8, 8
PAPER = {
    "Llama-3.1-70B-Instruct": {"vs_standard": 1.28, "of_fault_scaled": 0.95, "vs_nonuniform": 1.20},
    "Mixtral-8x22B-v0.1": {"vs_standard": 1.71, "of_fault_scaled": 0.92, "vs_nonuniform": 1.17},
}
# (name, GPU failures per GPU-hour, mean hours to return): the synthetic availability scenarios.
SCENARIOS = (("mild", 0.02, 2.0), ("gcp-like", 0.05, 2.0), ("harsh", 0.10, 3.0))


def lognormal_lengths(rng: np.random.Generator, mean: float, median: float, high: int, n: int) -> np.ndarray:
    """Log-normal lengths with the given mean and median, clipped to [1, high]."""
    sigma = float(np.sqrt(2 * np.log(mean / median)))
    return np.clip(rng.lognormal(np.log(median), sigma, n), 1, high).astype(int)


def offline_throughput(
    model: str, gpus: int, mode: str, variant: str, requests: int, window: float
) -> dict[str, Any]:
    """Tokens/s of one configuration with every request present at once (the paper's offline setting)."""
    spec, device = load_model(model), builtin_catalog()[DEVICE]
    cyclic = {"cyclic": True, "naive": False}.get(variant)
    layout = plan_layout(spec, gpus, mode, cyclic=cyclic)  # type: ignore[arg-type]
    if not layout.fits(device, LONGEST):
        return {"model": model, "gpus": gpus, "mode": mode, "variant": variant, "ranks": None, "tok_s": 0.0}
    rng = np.random.default_rng(7)
    inp = lognormal_lengths(rng, *OPENTHOUGHTS["input"], requests)
    out = lognormal_lengths(rng, *OPENTHOUGHTS["output"], requests)
    balanced = mode == "raidserve" and variant != "unbalanced-routing"
    sim = ReplicaSim(
        layout,
        device,
        routing="least_loaded" if balanced else "round_robin",
        chunking="adaptive" if balanced else "fifo",
        limits=EngineLimits(max_seqs=MAX_SEQS),
    )
    for a, b in zip(inp, out, strict=True):
        sim.submit(0.0, int(a), int(b))
    began = time.perf_counter()
    sim.run_until(window)
    start = sim.stats.generated
    sim.run_until(2 * window)
    return {
        "model": model,
        "gpus": gpus,
        "mode": mode,
        "variant": variant,
        "ranks": layout.ranks,
        "tok_s": (sim.stats.generated - start) / window,
        "running": len(sim.running),
        "preempted": sim.stats.preempted,
        "max_batch_tokens": layout.max_batch_tokens(device),
        "wall_s": round(time.perf_counter() - began, 2),
    }


def online_recovery(method: str, rate: float = ONLINE_RATE, requests: int = 500) -> dict[str, Any]:
    """Fig. 13: a TP8 RaidServe decode instance loses GPU 3 100 ms after the 250th request arrives; the max time
    between tokens of every request, with the lost state recomputed, restored from the host backup with
    weights re-sharded, or restored with weights on demand (`none`: no failure)."""
    spec, device = load_model(MODELS[0]), builtin_catalog()[DEVICE]
    rng = np.random.default_rng(11)
    mean, median, high = MOONCAKE["input"]
    prompts = lognormal_lengths(rng, mean, median, high, requests)
    outputs = np.clip(rng.normal(MOONCAKE["output"][0], 150, requests), 1, MOONCAKE["output"][2]).astype(int)
    arrivals = np.cumsum(rng.exponential(1 / rate, requests))
    before = plan_layout(spec, GPUS, "raidserve")
    sim = ReplicaSim(before, device)
    for a, p, o in zip(arrivals, prompts, outputs, strict=True):
        sim.submit(float(a), int(p), int(o), prefilled=True)  # a decode instance: prompts arrive computed
    sim.run_until(float(arrivals[requests // 2 - 1]) + 0.1)
    inflight = [r.context for r in sim.running]
    downtime = 0.0
    if method != "none":
        plan = plan_recovery(before, 3, device, inflight)
        times = plan.times
        downtime = {
            "recompute": times["recompute"] - times["prefill"],
            "host": times["host"],
            "full": times["full"],
        }[method]
        # Recompute re-prefills the lost caches on the survivors, which the simulator does itself.
        sim.reconfigure(plan.after, downtime, keep_cache=method != "recompute")
    sim.run_until(float(arrivals[-1]) + 600)
    gaps = np.asarray(sim.stats.max_tbt) * 1000
    return {
        "method": method,
        "inflight_requests": len(inflight),
        "inflight_tokens": int(sum(inflight)),
        "downtime_ms": downtime * 1000,
        "finished": sim.stats.finished,
        "max_tbt_ms": {str(q): float(np.percentile(gaps, q)) for q in (50, 90, 99)},
        "max_tbt_cdf_ms": np.sort(gaps).tolist(),
    }


def availability_trace(
    rng: np.random.Generator, fail_per_hour: float, repair_hours: float, hours: float
) -> list[tuple[float, int, int]]:
    """(time s, node, available GPUs after) events of independent on/off GPUs, all up at t = 0."""
    t_end = hours * 3600
    events: list[tuple[float, int, int]] = []
    for node in range(NODES):
        for _gpu in range(GPUS):
            t, up = 0.0, True
            while True:
                t += rng.exponential(3600 / fail_per_hour if up else repair_hours * 3600)
                if t >= t_end:
                    break
                up = not up
                events.append((t, node, -1 if not up else +1))
    events.sort()
    out, avail = [], [GPUS] * NODES
    for t, node, delta in events:
        avail[node] += delta
        out.append((t, node, avail[node]))
    return out


def replay(
    trace: list[tuple[float, int, int]], tput: dict[int, float], hours: float
) -> tuple[float, np.ndarray]:
    """Average cluster throughput over the trace, and throughput sampled each minute (for the plot)."""
    t_end = hours * 3600
    avail, since, down_until = [GPUS] * NODES, [0.0] * NODES, [0.0] * NODES
    tokens = 0.0
    minutes = np.zeros(int(hours * 60))

    def add(node: int, a: float, b: float) -> None:
        nonlocal tokens
        start = max(a, down_until[node])
        if b > start:
            rate = tput[avail[node]]
            tokens += rate * (b - start)
            lo, hi = int(start // 60), min(int(np.ceil(b / 60)), len(minutes))
            for m in range(lo, hi):
                overlap = min(b, (m + 1) * 60) - max(start, m * 60)
                if overlap > 0:
                    minutes[m] += rate * overlap / 60

    for t, node, now in trace:
        add(node, since[node], t)
        down_until[node] = t + RECONFIGURE_S  # every system reconfigures on every event (the paper's model)
        avail[node], since[node] = now, t
    for node in range(NODES):
        add(node, since[node], t_end)
    return tokens / t_end, minutes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests and a shorter window")
    p.add_argument("--hours", type=float, default=24.0, help="length of the availability trace")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-docs", action="store_true", help="print only")
    args = p.parse_args()
    requests, window = (600, 100.0) if args.quick else (1500, 200.0)
    began = time.perf_counter()
    device = builtin_catalog()[DEVICE]

    configs: dict[str, Any] = {}
    for model in MODELS:
        spec = load_model(model)
        table = {}
        for mode in MODES:
            row = []
            for n in range(1, GPUS + 1):
                layout = plan_layout(spec, n, mode)
                row.append(layout.ranks if layout.fits(device, LONGEST) else None)
            table[mode] = row
        configs[model] = {
            "table": table,
            "minimum": {m: minimum_devices(spec, device, m, LONGEST) for m in MODES},
        }

    jobs = [(m, n, mode, "default") for m in MODELS for mode in MODES for n in range(1, GPUS + 1)]
    jobs += [(m, 7, "nonuniform", "cyclic") for m in MODELS]
    jobs += [(m, 7, "raidserve", "unbalanced-routing") for m in MODELS]
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(offline_throughput, *zip(*[(*j, requests, window) for j in jobs], strict=True)))
    tput = {(r["model"], r["mode"], r["variant"], r["gpus"]): r["tok_s"] for r in runs}

    rng = np.random.default_rng(2026)
    availability: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    for name, fail, repair in SCENARIOS:
        trace = availability_trace(rng, fail, repair, args.hours)
        gpu_seconds, avail, last = 0.0, [GPUS] * NODES, 0.0
        for t, node, now in trace:
            gpu_seconds += sum(avail) * (t - last)
            last, avail[node] = t, now
        gpu_seconds += sum(avail) * (args.hours * 3600 - last)
        share = gpu_seconds / (NODES * GPUS * args.hours * 3600)
        result: dict[str, Any] = {"fail_per_gpu_hour": fail, "repair_hours": repair, "availability": share}
        for model in MODELS:
            full = tput[(model, "standard", "default", GPUS)] * NODES
            row: dict[str, Any] = {"fault_free_tok_s": full, "fault_scaled_tok_s": full * share}
            for mode in MODES:
                per_g = {0: 0.0, **{g: tput[(model, mode, "default", g)] for g in range(1, GPUS + 1)}}
                mean, minutes = replay(trace, per_g, args.hours)
                row[mode] = mean
                curves.setdefault(name, {}).setdefault(model, {})[mode] = minutes.tolist()
            row["raidserve_vs_standard"] = row["raidserve"] / row["standard"] if row["standard"] else None
            row["raidserve_vs_nonuniform"] = (
                row["raidserve"] / row["nonuniform"] if row["nonuniform"] else None
            )
            row["raidserve_of_fault_scaled"] = row["raidserve"] / row["fault_scaled_tok_s"]
            result[model] = row
        availability[name] = result

    llama, h100 = load_model(MODELS[0]), device
    plan = plan_recovery(plan_layout(llama, GPUS, "raidserve"), 3, h100, [16384] * 56)
    recovery = {
        "times_s": plan.times,
        "per_survivor_pcie_gb": [round(t.pcie / 1e9, 3) for t in plan.on_demand],
        "per_survivor_nvlink_gb": [round(t.nvlink / 1e9, 3) for t in plan.on_demand],
        "naive_weights_gb": [round(w / 1e9, 3) for w in plan.naive_weights],
        "paper_s": {"recompute": 22.0, "host": 0.53, "full": 0.12, "oracle": 0.015},
    }
    with ProcessPoolExecutor(args.workers) as pool:
        online = list(pool.map(online_recovery, ("none", "recompute", "host", "full")))
    doc = {
        "configs": configs,
        "online_recovery": online,
        "offline": runs,
        "availability": availability,
        "recovery": recovery,
        "paper": PAPER,
        "settings": {"requests": requests, "window_s": window, "hours": args.hours, "device": DEVICE},
        "run_s": round(time.perf_counter() - began, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    print(json.dumps(doc, indent=2))
    if not args.no_docs:
        write_docs(doc, curves)
    return 0


def write_docs(doc: dict[str, Any], curves: dict[str, Any]) -> None:
    """docs/benchmarks/raidserve.{json,md} and the plots."""
    out = ROOT / "docs" / "benchmarks"
    (out / "raidserve.json").write_text(json.dumps(doc, indent=2) + "\n")
    from raidserve_report import markdown, plots

    plots(doc, curves, out)
    (out / "raidserve.md").write_text(markdown(doc))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
