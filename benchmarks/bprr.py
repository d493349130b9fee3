"""Sun et al.'s evaluation of PETALS vs CG-BP + WS-RR, re-run on our pipeline-parallel inference simulator.

Reproduces Tables 4-5 (per-token time, with the first-token and remaining-token breakdowns of Tables C.7-C.10)
for the clustered setting (client in Cluster0/1/2) and the scattered one (AboveNet, BellCanada, GTS-CE stand-ins),
at 0.1 and 0.5 requests/s and l_max 64 and 128, 100 requests per run, in two modes: 'calibrated' (the authors'
per-session setup constants, as their MATLAB simulator) and 'model' (Eq. 1 plus waiting only). Then Table 6
(running time) and the sweeps of Figs. 6-9 with the three ablations. Writes docs/benchmarks/bprr.{json,md} and
bprr_*.png; prints the JSON.

    python benchmarks/bprr.py [--quick] [--runs 20] [--sweep-runs 5] [--workers 2] [--no-sweeps]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from opentela.scheduler.bprr.scenarios import PAPER_ETA, PAPER_SERVERS, Scenario, clustered, scattered
from opentela.scheduler.bprr.sim_experiments import SYSTEMS, Mode, run_systems
from opentela.scheduler.bprr.topologies import TABLE3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bprr_report import write_report

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
TABLE_SCENARIOS = ("Cluster0", "Cluster1", "Cluster2", "AboveNet", "BellCanada", "GTS-CE")
RATES, LMAXES = (0.1, 0.5), (64, 128)
N_REQUESTS = 100
SWEEPS: dict[str, dict[str, list[float]]] = {
    "fig6_C": {
        "AboveNet": [6, 10, 15, 20, 22],
        "BellCanada": [10, 15, 20, 30, 40],
        "GTS-CE": [20, 30, 45, 60, 90],
    },
    "fig7_eta": {t: [0.1, 0.2, 0.3, 0.4, 0.5] for t in TABLE3},
    "fig8_lambda": {t: [0.1, 0.3, 0.5, 0.7, 0.9] for t in TABLE3},
    "fig9_lmax": {t: [32, 64, 128, 256, 512] for t in TABLE3},
}
"""x values per figure and topology; the others stay at C = 0.4 #nodes, eta = 0.2, lambda = 0.5, l_max = 128."""

Task = tuple[str, Mode, int, dict[str, float], tuple[int, ...], tuple[str, ...]]


def build(name: str, servers: int, eta: float, lmax: int, rng: np.random.Generator) -> Scenario:
    """A clustered scenario by client cluster, or a scattered one with `servers` nodes drawn from `rng`."""
    if name.startswith("Cluster"):
        return clustered(int(name[-1]), lmax)
    return scattered(name, servers, eta, rng, lmax)


def run_task(task: Task) -> dict[str, dict[str, float]]:
    """One Monte Carlo run of every requested system: build the deployment, draw arrivals, simulate."""
    name, mode, run, p, seed, systems = task
    place_rng = np.random.default_rng([*seed, run])  # same deployment for every rate and l_max of a run
    scenario = build(name, int(p["C"]), p["eta"], int(p["lmax"]), place_rng)
    rng = np.random.default_rng([*seed, run, round(p["rate"] * 1000), int(p["lmax"]), int(p["n"])])
    out = run_systems(scenario, p["rate"], int(p["n"]), rng, mode=mode, systems=systems)
    return {s: {**r.metrics, "plan_s": r.plan_s, "route_s": r.route_s} for s, r in out.items()}


def aggregate(runs: Iterable[dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Mean (and std of the per-token time) over the runs where the system could serve at all."""
    by_system: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in runs:
        for system, metrics in run.items():
            by_system[system].append(metrics)
    out: dict[str, dict[str, Any]] = {}
    for system, rows in by_system.items():
        ok = [r for r in rows if not math.isnan(r["per_token_s"])]
        agg: dict[str, Any] = {"runs": len(rows), "infeasible_runs": len(rows) - len(ok)}
        source = ok or rows
        for key in rows[0]:
            values = [r[key] for r in source if key in r and not math.isnan(r[key])]
            agg[key] = statistics.fmean(values) if values else math.nan
        per_token = [r["per_token_s"] for r in ok]
        agg["per_token_std_s"] = statistics.stdev(per_token) if len(per_token) > 1 else 0.0
        agg["time_s"] = [r["plan_s"] + r["route_s"] for r in rows]
        out[system] = agg
    return out


def table_tasks(
    runs: int, seed: int, modes: tuple[Mode, ...]
) -> list[tuple[tuple[str, str, float, int], Task]]:
    """Tables 4-5: every scenario x mode x rate x l_max x run, PETALS and the proposed system."""
    tasks: list[tuple[tuple[str, str, float, int], Task]] = []
    for i, name in enumerate(TABLE_SCENARIOS):
        for mode in modes:
            for rate in RATES:
                for lmax in LMAXES:
                    p = {
                        "C": PAPER_SERVERS.get(name, 9),
                        "eta": PAPER_ETA,
                        "lmax": lmax,
                        "rate": rate,
                        "n": N_REQUESTS,
                    }
                    for run in range(runs):
                        tasks.append(
                            (
                                (name, mode, rate, lmax),
                                (name, mode, run, p, (seed, i), ("petals", "proposed")),
                            )
                        )
    return tasks


def sweep_tasks(
    runs: int, seed: int, modes: tuple[Mode, ...]
) -> list[tuple[tuple[str, str, str, float], Task]]:
    """Figs. 6-9: one parameter varied per figure on each topology, all five systems, in each mode."""
    tasks: list[tuple[tuple[str, str, str, float], Task]] = []
    for mode, (f, (fig, grid)) in ((m, x) for m in modes for x in enumerate(SWEEPS.items())):
        for t, (topo, xs) in enumerate(grid.items()):
            for x in xs:
                p = {"C": round(0.4 * TABLE3[topo].n_nodes), "eta": 0.2, "lmax": 128, "rate": 0.5, "n": 100}
                key = {"fig6_C": "C", "fig7_eta": "eta", "fig8_lambda": "rate", "fig9_lmax": "lmax"}[fig]
                p[key] = x
                if fig == "fig8_lambda":
                    p["n"] = round(200 * x)  # the paper's N_R = 200 lambda
                for run in range(runs):
                    tasks.append(((mode, fig, topo, x), (topo, mode, run, p, (seed, 100 + f, t), SYSTEMS)))
    return tasks


def execute(tasks: list[Task], workers: int) -> list[dict[str, dict[str, float]]]:
    """Run the tasks, in worker processes when asked; results come back in task order."""
    if workers <= 1:
        return [run_task(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_task, tasks, chunksize=4))


def running_times(tables: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """Table 6: placement plus all routing decisions per run, pooled over rates and lengths (calibrated mode)."""
    pooled: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in tables["calibrated"]:
        group = "Clustered" if row["scenario"].startswith("Cluster") else row["scenario"]
        for system in ("petals", "proposed"):
            pooled[group][system].extend(row[system]["time_s"])
    return {
        g: {s: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for s, v in d.items()}
        for g, d in pooled.items()
    }


def _clean(value: Any) -> Any:
    """NaN (an infeasible placement) as JSON null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 runs per cell, 1 per sweep point")
    parser.add_argument("--runs", type=int, default=None, help="Monte Carlo runs per table cell (default 20)")
    parser.add_argument("--sweep-runs", type=int, default=None, help="runs per sweep point (default 5)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--no-sweeps", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 20)
    sweep_runs = args.sweep_runs or (1 if args.quick else 5)
    began = time.perf_counter()

    keyed = table_tasks(runs, args.seed, ("calibrated", "model"))
    results = execute([t for _, t in keyed], args.workers)
    grouped: dict[tuple[str, str, float, int], list[dict[str, dict[str, float]]]] = defaultdict(list)
    for (key, _), res in zip(keyed, results, strict=True):
        grouped[key].append(res)
    tables: dict[str, list[dict[str, Any]]] = {"calibrated": [], "model": []}
    for (name, mode, rate, lmax), rows in grouped.items():
        tables[mode].append({"scenario": name, "rate": rate, "lmax": lmax, **aggregate(rows)})
    table_s = time.perf_counter() - began

    sweeps: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    if not args.no_sweeps:
        skeyed = sweep_tasks(sweep_runs, args.seed, ("calibrated", "model"))
        sresults = execute([t for _, t in skeyed], args.workers)
        sgrouped: dict[tuple[str, str, str, float], list[dict[str, dict[str, float]]]] = defaultdict(list)
        for (skey, _), res in zip(skeyed, sresults, strict=True):
            sgrouped[skey].append(res)
        for (mode, fig, topo, x), rows in sgrouped.items():
            sweeps.setdefault(mode, {}).setdefault(fig, {}).setdefault(topo, []).append(
                {"x": x, **aggregate(rows)}
            )

    result = {
        "benchmark": "bprr",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "workers": args.workers},
        "settings": {
            "runs": runs,
            "sweep_runs": sweep_runs,
            "requests": N_REQUESTS,
            "seed": args.seed,
            "sweeps": SWEEPS,
            "admission": "backoff (PETALS' client: retry after 1, 2, 4, ... s, at most 60 s apart)",
        },
        "tables": tables,
        "running_time": running_times(tables),
        "sweeps": sweeps,
        "elapsed_s": {"tables": table_s, "total": time.perf_counter() - began},
    }
    for mode_rows in tables.values():
        for row in mode_rows:
            for system in ("petals", "proposed"):
                row[system].pop("time_s", None)
    for figs in sweeps.values():
        for by_topo in figs.values():
            for rows in by_topo.values():
                for row in rows:
                    for system in SYSTEMS:
                        row[system].pop("time_s", None)
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_clean(result), indent=1)
    (args.out / "bprr.json").write_text(text + "\n")
    write_report(result, args.out)
    print(text)


if __name__ == "__main__":
    main()
