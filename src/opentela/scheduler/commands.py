"""The `otela simulate` and `otela plan` commands: flags, runs, and their Rich tables or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opentela.bench.traces import TRACE_FORMATS, parse_model_map, read_trace, select_models
from opentela.errors import ConfigError
from opentela.scheduler.calibration import calibrated_catalog, default_store
from opentela.scheduler.hardware import HardwareCatalog, load_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.placement import Cluster, Plan, Problem, check_plan, get_policy, simulate_plan
from opentela.scheduler.roofline import Precision
from opentela.scheduler.simulator import POLICIES, EngineLimits, ReplicaSpec, SimResult, simulate
from opentela.scheduler.tables import SimSettings, TableBuilder
from opentela.scheduler.workload import (
    LengthDist,
    Trace,
    Workload,
    load_workloads,
    poisson_trace,
    trace_from_records,
    workloads_from_trace,
)


def _length(text: str) -> LengthDist:
    try:
        mean, _, std = text.partition(":")
        return LengthDist(float(mean), float(std or 0.0))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MEAN or MEAN:STD, got {text!r}") from None


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hardware", metavar="FILE", help="extra hardware catalog (YAML, same format as the shipped one)"
    )
    p.add_argument(
        "--weights", default="fp16", help="weight format: fp16, bf16, fp8, int8, int4, q4_1 (default fp16)"
    )
    p.add_argument("--kv-dtype", default="fp16", help="KV-cache format: fp16, fp8, int8 (default fp16)")
    p.add_argument("--max-seqs", type=int, default=256, help="sequences per batch (default 256)")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="new tokens per step (default 8192)")
    p.add_argument("--mem-util", type=float, default=0.9, help="share of device memory the engine uses (0.9)")
    p.add_argument(
        "--chunked-prefill",
        action="store_true",
        help="split prompts into chunks that fill each step's --max-batched-tokens beside the decoders",
    )
    p.add_argument("--schedule", choices=POLICIES, default="fcfs", help="admission order: fcfs or spf (fcfs)")
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=0,
        help="prompt-prefix tokens each replica caches (LRU over 16-token blocks; default 0: off)",
    )
    p.add_argument(
        "--prefix-hit-ratio",
        type=float,
        default=0.0,
        help="share of each prompt found cached when the trace has no prefix hashes (default 0)",
    )
    p.add_argument(
        "--engine",
        default="vllm",
        help="serving engine whose stored calibration (step model) applies per device (default vllm)",
    )
    p.add_argument(
        "--step-models",
        metavar="DIR",
        help="directory of calibrations (default $OTELA_STEP_MODELS or ~/.config/opentela/step-models)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the synthetic trace")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _add_trace_flags(p: argparse.ArgumentParser, model_help: str, metavar: str = "NAME") -> None:
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default="auto", help="the trace's format (auto)")
    p.add_argument("--trace-model", action="append", default=[], metavar=metavar, help=model_help)
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="play the trace this many times faster: closer arrivals, higher rates (1)",
    )


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `otela simulate` (and of `otela simulate calibrate`)."""
    p.add_argument(
        "action",
        nargs="?",
        choices=("run", "calibrate"),
        default="run",
        help="run a simulation (default), or calibrate the step model of --gpu for --engine",
    )
    p.add_argument("--model", help="shipped model name or a config.json path (required)")
    p.add_argument("--gpu", metavar="DEVICE", help="device type from the hardware catalog (required)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallelism per replica (default 1)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas behind the router (default 1)")
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrival rate, requests/s (default 1)")
    p.add_argument(
        "--input", type=_length, default=LengthDist(512.0), metavar="MEAN[:STD]", help="prompt tokens"
    )
    p.add_argument(
        "--output", type=_length, default=LengthDist(256.0), metavar="MEAN[:STD]", help="output tokens"
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (default 60)")
    p.add_argument("--burst", type=int, metavar="N", help="instead of Poisson arrivals: N requests at time 0")
    p.add_argument("--trace", metavar="FILE", help="replay a trace (any format of docs/traces.md)")
    _add_trace_flags(p, "replay only the trace's requests for this model (repeatable; all run on --model)")
    _add_engine_flags(p)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `otela plan`."""
    p.add_argument("--cluster", required=True, metavar="FILE", help="YAML: devices: {TYPE: COUNT}")
    p.add_argument("--workload", metavar="FILE", help="YAML: models: [{model, rate, input, output}]")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="instead of --workload: each model's rate and lengths from a trace (docs/traces.md)",
    )
    _add_trace_flags(
        p,
        "plan only the trace's model NAME, as the shipped model or config MODEL (repeatable)",
        "NAME[=MODEL]",
    )
    p.add_argument("--policy", default="cpsat", help="placement policy name or package.module:Class (cpsat)")
    p.add_argument("--baseline", default="memp", help="policy to compare with, or 'none' (default memp)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for the solver (default 60)")
    p.add_argument("--shares", type=int, default=20, help="traffic split granularity K (default 20)")
    p.add_argument("--sim-duration", type=float, default=20.0, help="seconds of traffic per evaluation (20)")
    p.add_argument("--table-points", type=int, default=20, help="simulated rates per latency table (20)")
    _add_engine_flags(p)


def _limits(ns: argparse.Namespace) -> EngineLimits:
    if ns.max_seqs < 1 or ns.max_batched_tokens < 1 or not 0 < ns.mem_util <= 1:
        raise ConfigError("--max-seqs and --max-batched-tokens must be positive and --mem-util in (0, 1]")
    return EngineLimits(
        ns.max_seqs,
        ns.max_batched_tokens,
        ns.mem_util,
        chunked_prefill=ns.chunked_prefill,
        policy=ns.schedule,
        prefix_cache_tokens=ns.prefix_cache_tokens,
        prefix_hit_ratio=ns.prefix_hit_ratio,
    )


def step_model_dir(ns: argparse.Namespace) -> Path:
    """Where calibrations are read and written: --step-models, else the default store."""
    return Path(ns.step_models) if ns.step_models else default_store()


def _calibrated(catalog: HardwareCatalog, ns: argparse.Namespace) -> HardwareCatalog:
    # Devices with a stored calibration for --engine simulate with its step model; the others stay pure roofline.
    return calibrated_catalog(catalog, ns.engine, step_model_dir(ns))


def _trace_with_prefixes(ns: argparse.Namespace) -> tuple[Trace, list[tuple[str, ...]] | None]:
    chosen = parse_model_map(ns.trace_model)
    records = read_trace(ns.trace, ns.trace_format)
    models = dict.fromkeys(chosen, 0) if chosen else None
    trace = trace_from_records(records, models)
    # The same order as trace_from_records: the kept records, stably sorted by arrival.
    kept = sorted((r for r in records if models is None or r.model in models), key=lambda r: r.timestamp)
    hashes = [r.prefix_hashes for r in kept]
    return trace, hashes if any(hashes) else None


def simulate_command(ns: argparse.Namespace) -> dict[str, Any]:
    """Run `otela simulate`; returns the JSON document it prints."""
    if not ns.model or not ns.gpu:
        raise ConfigError("otela simulate needs --model and --gpu")
    device = _calibrated(load_catalog(ns.hardware), ns)[ns.gpu]
    model = load_model(ns.model)
    spec = ReplicaSpec(model, device, ns.tp, Precision(ns.weights, ns.kv_dtype), _limits(ns))
    spec.check()
    if ns.dp < 1 or ns.rate <= 0:
        raise ConfigError("--dp must be at least 1 and --rate positive")
    rng = np.random.default_rng(ns.seed)
    prefixes = None
    if ns.trace:
        if ns.speedup <= 0:
            raise ConfigError("--speedup must be positive")
        trace, prefixes = _trace_with_prefixes(ns)
        if not len(trace):
            raise ConfigError(
                f"trace {ns.trace} has no requests" + (" of the chosen models" if ns.trace_model else "")
            )
        trace = Trace(trace.arrival / ns.speedup, trace.input_len, trace.output_len, trace.model * 0)
    elif ns.burst:
        inp, out = ns.input.sample(rng, ns.burst), ns.output.sample(rng, ns.burst)
        trace = Trace(np.zeros(ns.burst), inp, out, np.zeros(ns.burst, dtype=np.int64))
    else:
        trace = poisson_trace([Workload(model.name, ns.rate, ns.input, ns.output)], ns.duration, rng)
    started = time.perf_counter()
    result = simulate([spec] * ns.dp, trace, prefixes=prefixes)
    return {
        "model": model.name,
        "device": device.name,
        "step_model": None if device.step.is_identity else device.step.to_dict(),
        "tp": ns.tp,
        "dp": ns.dp,
        "kv_capacity_tokens_per_replica": spec.kv_capacity_tokens,
        "metrics": result.metrics(),
        "prompt_tokens_cached_share": _cached_share(result),
        "simulated_steps": result.steps,
        "wall_seconds": round(time.perf_counter() - started, 4),
    }


def _cached_share(result: SimResult) -> float:
    # The share of prompt tokens the prefix cache served, over requests that finished their prefill.
    if result.prompt_computed is None or result.prompt_cached is None:
        return 0.0
    total = int(result.prompt_computed.sum() + result.prompt_cached.sum())
    return round(int(result.prompt_cached.sum()) / total, 4) if total else 0.0


def _fmt(v: float, unit: str = "s") -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v * 1000:.1f} ms" if unit == "s" and v < 1 else f"{v:.2f} {unit}".strip()


def print_simulation(doc: dict[str, Any], console: Console) -> None:
    """The simulate result as a table."""
    m = doc["metrics"]
    table = Table(title=f"{doc['model']} on {doc['dp']} x {doc['tp']} x {doc['device']}")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for name in ("ttft", "tpot", "e2e"):
        table.add_row(name.upper(), *(_fmt(m[f"{name}_{c}"]) for c in ("mean", "p50", "p90", "p99")))
    console.print(table)
    console.print(
        f"throughput {m['throughput_rps']:.2f} req/s, {m['throughput_tps']:.0f} output tok/s over the run, "
        f"{m['window_tps']:.0f} tok/s while arrivals last (offered {m['offered_tps']:.0f}); "
        f"{int(m['completed'])}/{int(m['requests'])} completed, {int(m['preemptions'])} preemptions, "
        f"{int(m['rejected'])} rejected; KV room {doc['kv_capacity_tokens_per_replica']} tokens per replica"
    )


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("preparing", total=1.0)

        def update(description: str, fraction: float) -> None:
            bar.update(task, description=description, completed=fraction)

        yield update


def plan_workloads(ns: argparse.Namespace) -> list[Workload]:
    """The workloads to plan for: from --workload's file, or derived from --trace's requests."""
    if bool(ns.workload) == bool(ns.trace):
        raise ConfigError("otela plan needs either --workload FILE or --trace FILE")
    if not ns.trace:
        return load_workloads(ns.workload)
    records = select_models(read_trace(ns.trace, ns.trace_format), parse_model_map(ns.trace_model))
    return workloads_from_trace(records, speedup=ns.speedup)


def plan_command(ns: argparse.Namespace, show_progress: bool = True) -> dict[str, Any]:
    """Run `otela plan`; returns the JSON document it prints."""
    cluster = Cluster.load(ns.cluster, ns.hardware)
    cluster = dataclasses.replace(cluster, catalog=_calibrated(cluster.catalog, ns))
    workloads = plan_workloads(ns)
    if ns.table_points < 2:
        raise ConfigError("--table-points must be at least 2")
    settings = SimSettings(horizon_s=ns.sim_duration, rate_points=ns.table_points, seed=ns.seed)
    builder = TableBuilder(_limits(ns), Precision(ns.weights, ns.kv_dtype), settings)
    problem = Problem(cluster, workloads, builder, shares=ns.shares, time_limit_s=ns.time_limit)
    plans: list[Plan] = []
    names = [ns.policy] + ([] if ns.baseline in ("", "none") else [ns.baseline])
    with _progress(show_progress) as progress:
        for name in names:
            plan = get_policy(name).place(problem, progress)
            violations = check_plan(problem, plan)
            if violations:
                raise ConfigError(f"policy {name} returned an invalid plan: {'; '.join(violations)}")
            plans.append(plan)
    doc: dict[str, Any] = {
        "cluster": dict(cluster.devices),
        "workload": [
            {"model": w.model, "rate": w.rate, "input_mean": w.input.mean, "output_mean": w.output.mean}
            for w in workloads
        ],
        "simulator_evaluations": builder.evaluations,
        "evaluations_per_minute": round(builder.evaluations_per_minute),
        "plans": [],
    }
    for plan in plans:
        entry = plan.as_dict()
        entry["simulated"] = simulate_plan(problem, plan, duration=ns.sim_duration, seed=ns.seed + 1)
        doc["plans"].append(entry)
    return doc


def print_plan(doc: dict[str, Any], console: Console) -> None:
    """Placement, predicted and simulated metrics of each plan as tables."""
    devices = list(doc["cluster"])
    alloc = Table(title="Placement (devices per model and type; groups as DP x TP)")
    alloc.add_column("model")
    for plan in doc["plans"]:
        alloc.add_column(plan["policy"])
    for w in doc["workload"]:
        row = [f"{w['model']} ({w['rate']:g} req/s)"]
        for plan in doc["plans"]:
            cells = [
                f"{g['dp']}x{g['tp']} {g['device']} ({g['share']:.0%})"
                for g in plan["groups"]
                if g["model"] == w["model"]
            ]
            row.append("\n".join(cells) or "-")
        alloc.add_row(*row)
    console.print(alloc)
    perf = Table(title="Predicted (latency tables) and simulated (whole cluster) performance")
    perf.add_column("policy")
    perf.add_column("predicted mean E2E", justify="right")
    for col in ("mean E2E", "p99 E2E", "mean TTFT", "mean TPOT", "tok/s served / offered"):
        perf.add_column(col, justify="right")
    perf.add_column("devices used", justify="right")
    for plan in doc["plans"]:
        s = plan["simulated"]["overall"]
        used = sum(sum(row.values()) for row in plan["allocation"].values())
        perf.add_row(
            f"{plan['policy']} ({plan['status']}, {plan['solve_seconds']:.1f} s)",
            _fmt(plan["predicted_mean_e2e_s"]),
            _fmt(s["e2e_mean"]),
            _fmt(s["e2e_p99"]),
            _fmt(s["ttft_mean"]),
            _fmt(s["tpot_mean"]),
            f"{s['window_tps']:,.0f} / {s['offered_tps']:,.0f}",
            f"{used}/{sum(doc['cluster'][d] for d in devices)}",
        )
    console.print(perf)
    console.print(
        f"{doc['simulator_evaluations']} simulator evaluations, {doc['evaluations_per_minute']:,} per minute"
    )


def run(ns: argparse.Namespace) -> int:
    """Dispatch `simulate` or `plan` from parsed flags and print the result."""
    console = Console()
    if ns.cmd == "simulate":
        doc = simulate_command(ns)
        printer = print_simulation
    else:
        doc = plan_command(ns, show_progress=not ns.json)
        printer = print_plan
    if ns.json:
        print(json.dumps(doc, indent=2, default=float))
    else:
        printer(doc, console)
    return 0
