"""LLM-Mesh's end-to-end experiment (its section 8.2) as a grid of simulations: model size x model count x policy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opentela.scheduler.llm_mesh.cluster import ClusterSpec, MeshSimulator, Outcome
from opentela.scheduler.llm_mesh.policies import POLICY_NAMES, make_policy
from opentela.scheduler.llm_mesh.profiles import MODELS
from opentela.scheduler.llm_mesh.workload import AzureStandIn

TTFT_PERCENTILES = tuple(range(0, 101))
TIMELINE_STEP_S = 5.0


@dataclass(frozen=True)
class Experiment:
    """One cell of the grid: `count` models of one `size` under one policy, on the same trace for all policies."""

    size: str
    count: int
    policy: str
    window_s: float = 1800.0
    seed: int = 1
    workload: AzureStandIn = field(default_factory=AzureStandIn)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)


def run_experiment(exp: Experiment) -> dict[str, Any]:
    """Simulate one cell and summarise it as JSON-ready numbers."""
    started = time.perf_counter()
    trace = exp.workload.trace(exp.count, exp.window_s, np.random.default_rng(exp.seed))
    policy = make_policy(exp.policy, dict.fromkeys(range(exp.count), exp.size))
    sim = MeshSimulator(
        exp.cluster,
        [MODELS[exp.size]] * exp.count,
        trace,
        policy,
        exp.workload.mean_output,
        np.random.default_rng(exp.seed + 1000),
    )
    out = sim.run(window_s=exp.window_s)
    summary = summarise(out)
    summary.update(
        size=exp.size,
        count=exp.count,
        policy=exp.policy,
        wall_s=round(time.perf_counter() - started, 2),
        evictions=getattr(policy, "evictions", 0),
        preemptions=getattr(policy, "preemptions", 0),
    )
    return summary


def summarise(out: Outcome) -> dict[str, Any]:
    """SLO compliance, node use, per-node decode throughput, the TTFT distribution and the node-use timeline."""
    ok = out.slo_compliant()
    ttft = out.ttft()
    finite = np.where(np.isfinite(ttft), ttft, np.nan)
    # A request that never got a first token sorts last; its percentiles read "never" (None).
    never = 1e12
    ranked: list[float] = (
        [float(q) for q in np.percentile(np.where(np.isfinite(ttft), ttft, never), TTFT_PERCENTILES)]
        if len(ttft)
        else []
    )
    quantiles = [None if q >= never / 2 else round(float(q), 4) for q in ranked]
    validated = [r for r in out.requests if r.validated]
    return {
        "requests": len(out.requests),
        "slo_compliant": int(ok.sum()),
        "slo_compliant_ttft_and_mean_tpot": int(out.ttft_and_mean_tpot_compliant().sum()),
        "dropped": int(sum(r.dropped for r in out.requests)),
        "cpu_nodes": round(out.nodes_used("cpu"), 3),
        "gpu_nodes": round(out.nodes_used("gpu"), 3),
        "cpu_decode_tok_s_per_node": round(out.decode_throughput("cpu"), 1),
        "gpu_decode_tok_s_per_node": round(out.decode_throughput("gpu"), 1),
        "served_on_cpu": int(sum(r.served_on == "cpu" for r in out.requests)),
        "ttft_mean_s": round(float(np.nanmean(finite)), 3) if np.isfinite(ttft).any() else None,
        "ttft_percentiles_s": quantiles,
        "validated": len(validated),
        "validated_late_tokens": int(sum(r.late_tokens for r in validated)),
        "validated_with_a_late_token": int(sum(r.late_tokens > 0 for r in validated)),
        "timeline": _timeline(out),
    }


def _timeline(out: Outcome) -> list[tuple[float, int, int]]:
    """(time, CPU nodes, GPU nodes) in use, sampled every TIMELINE_STEP_S over the window."""
    times = [t for t, _, _ in out.timeline]
    samples = []
    t = 0.0
    while t <= out.window_s:
        i = max(0, int(np.searchsorted(times, t, side="right")) - 1)
        samples.append((t, out.timeline[i][1], out.timeline[i][2]))
        t += TIMELINE_STEP_S
    return samples


def grid(sizes: tuple[str, ...], counts: tuple[int, ...], window_s: float,
         workload: AzureStandIn) -> list[Experiment]:  # fmt: skip
    """Every (size, count, policy) cell, each count's trace shared by the three policies."""
    return [
        Experiment(size, count, policy, window_s=window_s, workload=workload)
        for size in sizes
        for count in counts
        for policy in POLICY_NAMES
    ]
