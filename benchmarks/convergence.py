"""Registry convergence and idle control traffic with N real node processes on loopback.

For each N: start an ingress (the bootstrap) and N-1 nodes without engines, wait until every replica knows
every node, then measure
  - idle control traffic per node (bytes the node's process wrote and read, over a quiet window),
  - a join: one more node starts; for every other node, the time from the newcomer's own JOIN record to that
    replica applying it,
  - a model: one more node starts a (simulated) engine; the time from its SERVING record to each replica applying it.
Separately, for the traffic sizes (10 and 50 nodes by default), the control traffic per node when the mesh is
idle and under re-registration churn (every `--churn-period` seconds one worker leaves and a new one joins).
Each node appends "time session state version local" to a trace file per applied change (node.trace_dir).
Prints JSON and writes docs/benchmarks/convergence.{json,md,png}.

    python benchmarks/convergence.py [--sizes 8,16,32,64,128] [--traffic-sizes 10,50] [--idle-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil

from opentela.cli.localmesh import OTELA, LocalMesh

ROOT = Path(__file__).resolve().parents[1]


def read_traces(trace_dir: Path) -> dict[str, list[tuple[float, str, str, int, bool]]]:
    """Per observer session: (time, session, state, version, local) lines."""
    out: dict[str, list[tuple[float, str, str, int, bool]]] = {}
    for path in trace_dir.glob("*.trace"):
        rows = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                rows.append((float(parts[0]), parts[1], parts[2], int(parts[3]), parts[4] == "1"))
        out[path.stem] = rows
    return out


def known_sessions(rows: list[tuple[float, str, str, int, bool]]) -> set[str]:
    """Sessions an observer has applied (its own included)."""
    return {r[1] for r in rows}


def apply_delays(traces: dict, session: str, state: str) -> list[float]:
    """Seconds from `session`'s own write of `state` to each other replica applying it (or a later state)."""
    own = [r for r in traces.get(session, []) if r[1] == session and r[2] == state and r[4]]
    if not own:
        raise RuntimeError(f"{session} never wrote {state}")
    t0 = own[0][0]
    rank = ["JOIN", "SERVING", "DOWN", "LEFT"]
    delays = []
    for observer, rows in traces.items():
        if observer == session:
            continue
        hits = [r[0] for r in rows if r[1] == session and rank.index(r[2]) >= rank.index(state)]
        delays.append(min(hits) - t0 if hits else float("inf"))
    return delays


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p75/p95/max in seconds (inf when some replica never applied the change)."""
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {
        "replicas": len(ordered),
        "p50_s": round(at(0.50), 4),
        "p75_s": round(at(0.75), 4),
        "p95_s": round(at(0.95), 4),
        "slowest_s": round(ordered[-1], 4),
        "missing": sum(1 for v in ordered if v == float("inf")),
    }


async def wait_all_know(trace_dir: Path, n: int, timeout: float) -> float:
    """Wait until every one of n replicas has applied every one of the n sessions; returns seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        traces = read_traces(trace_dir)
        if len(traces) >= n and all(len(known_sessions(rows)) >= n for rows in traces.values()):
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    counts = sorted(len(known_sessions(r)) for r in read_traces(trace_dir).values())
    raise TimeoutError(f"replicas did not converge on {n} nodes in {timeout} s; known counts {counts[:5]}...")


def io_bytes(pids: list[int]) -> dict[int, tuple[int, int]]:
    """(bytes written, bytes read) by each process: socket traffic dominates for quiet nodes."""
    out = {}
    for pid in pids:
        try:
            io = psutil.Process(pid).io_counters()
            out[pid] = (io.write_chars, io.read_chars)
        except (psutil.Error, AttributeError):
            pass
    return out


def traffic_per_node(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], seconds: float
) -> dict:
    """Mean and max bytes/s (written + read) over the processes present in both samples."""
    per_node = [
        ((after[p][0] - before[p][0]) + (after[p][1] - before[p][1])) / seconds for p in before if p in after
    ]
    return {
        "nodes_measured": len(per_node),
        "mean_bytes_per_s": round(sum(per_node) / len(per_node), 1),
        "max_bytes_per_s": round(max(per_node), 1),
    }


async def ingress_knows(mesh: LocalMesh, count: int, timeout: float) -> None:
    """Wait until the ingress's replica holds `count` live records."""

    async def probe() -> bool | None:
        table = await mesh.get_json("/v1/dnt/table")
        live = [r for r in table or [] if r.get("lifecycle") in ("JOIN", "SERVING")]
        return True if len(live) >= count else None

    await mesh.wait_for(probe, timeout=timeout, what=f"the ingress to know {count} nodes", interval=0.25)


async def start_mesh(mesh: LocalMesh, n: int, trace_dir: Path) -> float:
    """An ingress and n-1 engine-less workers; returns seconds until every replica knows every node."""
    t_start = time.monotonic()
    await mesh.start_ingress("--log-level", "WARNING")
    for i in range(n - 1):
        await mesh.add_worker(f"n{i}", None, "--log-level", "WARNING")
        if i % 8 == 7 or i == n - 2:
            # Start in batches of 8, each once the ingress has registered the last: a 2-core machine takes
            # about a CPU-second to start one interpreter, and 128 at once would starve every node for minutes.
            await ingress_knows(mesh, i + 2, timeout=120)
    await wait_all_know(trace_dir, n, timeout=120 + 3 * n)
    took = time.monotonic() - t_start
    print(f"  N={n}: all {n} replicas know every node after {took:.1f} s", file=sys.stderr)
    return took


async def run_traffic(
    n: int, idle_seconds: float, churn_seconds: float, churn_period: float, workdir: Path
) -> dict:
    """Control traffic per node in a mesh of n: quiet, then while workers leave and new ones join."""
    trace_dir = workdir / "traces"
    env = {**os.environ, "OTELA_NODE_TRACE_DIR": str(trace_dir), "OTELA_LOG_LEVEL": "WARNING"}
    rng = random.Random(n)
    async with LocalMesh(workdir, env=env) as mesh:
        await start_mesh(mesh, n, trace_dir)
        await asyncio.sleep(10.0)  # let start-up traffic die down
        load_before = os.getloadavg()
        pids = [node.pid for node in mesh.nodes.values() if node.pid]
        before = io_bytes(pids)
        await asyncio.sleep(idle_seconds)
        idle = traffic_per_node(before, io_bytes(pids), idle_seconds)
        # Churn: one worker leaves (SIGTERM: LEFT) and a fresh one joins, every churn_period seconds. Measured
        # over the nodes that stay up the whole window (the ingress and the workers never picked).
        workers = [name for name in mesh.nodes if name.startswith("n")]
        victims = rng.sample(workers, min(len(workers) // 2, int(churn_seconds / churn_period) + 1))
        stable = [mesh.nodes[name].pid for name in mesh.nodes if name not in victims]
        before = io_bytes([p for p in stable if p])
        t0 = time.monotonic()
        events = 0
        for i, victim in enumerate(victims):
            if time.monotonic() - t0 >= churn_seconds:
                break
            await mesh.nodes[victim].stop()
            await mesh.add_worker(f"churn{i}", None, "--log-level", "WARNING")
            events += 1
            await asyncio.sleep(max(0.0, t0 + (i + 1) * churn_period - time.monotonic()))
        elapsed = time.monotonic() - t0
        churn = traffic_per_node(before, io_bytes([p for p in stable if p]), elapsed)
        churn["leave_join_pairs"] = events
        churn["period_s"] = churn_period
        return {
            "nodes": n,
            "idle": {**idle, "seconds": idle_seconds},
            "churn": {**churn, "seconds": round(elapsed, 1)},
            "load_average": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in os.getloadavg()],
            },
            "note": "written + read bytes of each node process (TLS records included)",
        }


async def run_size(n: int, idle_seconds: float, workdir: Path, events: int = 3) -> dict:
    """One mesh of n nodes: idle traffic, then `events` rounds of a join and a model announcement; each figure is
    the median over the rounds (one event is one sample of a machine whose speed drifts)."""
    trace_dir = workdir / "traces"
    env = {**os.environ, "OTELA_NODE_TRACE_DIR": str(trace_dir), "OTELA_LOG_LEVEL": "WARNING"}
    async with LocalMesh(workdir, env=env) as mesh:
        settle = await start_mesh(mesh, n, trace_dir)
        await asyncio.sleep(min(10.0, idle_seconds))  # let start-up traffic die down
        load = os.getloadavg()
        pids = [node.pid for node in mesh.nodes.values() if node.pid]
        before = io_bytes(pids)
        await asyncio.sleep(idle_seconds)
        idle = {**traffic_per_node(before, io_bytes(pids), idle_seconds), "seconds": idle_seconds}
        rounds = []
        for i in range(events):
            existing = set(read_traces(trace_dir))
            await mesh.add_worker(f"joiner{i}", None, "--log-level", "WARNING")
            await wait_all_know(trace_dir, len(existing) + 1, timeout=60)
            traces = read_traces(trace_dir)
            (joiner_session,) = set(traces) - existing
            join_delays = apply_delays(traces, joiner_session, "JOIN")
            existing = set(traces)
            await mesh.add_worker(
                f"server{i}",
                [*OTELA, "engine", "simulated", "--model", f"conv-model-{i}"],
                "--log-level",
                "WARNING",
            )
            await mesh.wait_serving(f"conv-model-{i}", 1, timeout=60)
            await asyncio.sleep(3)
            traces = read_traces(trace_dir)
            (server_session,) = set(traces) - existing
            rounds.append(
                {
                    "join": percentiles(join_delays),
                    # The joiner writes JOIN before it has dialed anyone; from the first replica that learns of
                    # it (its bootstrap peer), the rest is dissemination alone.
                    "join_from_first_replica": percentiles([d - min(join_delays) for d in join_delays]),
                    # From the joiner's write to its bootstrap peer's apply: the joiner's own start-up and dial.
                    "joiner_lead_s": round(min(join_delays), 4),
                    "serve_model": percentiles(apply_delays(traces, server_session, "SERVING")),
                    "delays": {
                        "join": sorted(join_delays),
                        "serve_model": sorted(apply_delays(traces, server_session, "SERVING")),
                    },
                }
            )
            print(
                f"  N={n} round {i + 1}: join {rounds[-1]['join']} model {rounds[-1]['serve_model']}",
                file=sys.stderr,
            )
        return {
            "nodes": n,
            "load_average": [round(x, 2) for x in load],
            "startup_converged_s": round(settle, 2),
            "events": events,
            **{
                key: median_figures([r[key] for r in rounds])
                for key in ("join", "join_from_first_replica", "serve_model")
            },
            "joiner_lead_s": sorted(r["joiner_lead_s"] for r in rounds)[len(rounds) // 2],
            "idle_traffic": idle,
            "rounds": [{k: v for k, v in r.items() if k != "delays"} for r in rounds],
            "delays": {
                key: sorted(d for r in rounds for d in r["delays"][key]) for key in ("join", "serve_model")
            },
        }


def median_figures(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds (the lower middle one for an even count)."""
    return {k: sorted(s[k] for s in samples)[(len(samples) - 1) // 2] for k in samples[0]}


def render(result: dict) -> str:
    """Markdown summary."""
    lines = [
        "# Registry convergence",
        "",
        "`benchmarks/convergence.py`: N real `otela start` processes on loopback (no engines, except the one",
        "that announces a model, which runs the simulated engine). Delays run from the originating node's own write to",
        "each other replica applying the change; all clocks are this machine's.",
        f"Machine: {result['machine']['cpus']} CPUs, Python {result['machine']['python']}.",
        *(
            [
                f"Each size ran {result['runs'][0]['events']} rounds of a join and a model announcement (a new node",
                "each, seconds apart); every figure below is its median over the rounds (each round is in the JSON).",
            ]
            if result["runs"] and result["runs"][0].get("events", 1) > 1
            else []
        ),
        "",
        "| N | join p50 | p75 | p95 | slowest | model p50 | p75 | p95 | slowest | idle B/s per node (mean / max) "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        j, s, i = r["join"], r["serve_model"], r["idle_traffic"]
        lines.append(
            f"| {r['nodes']} | {j['p50_s']} | {j['p75_s']} | {j['p95_s']} | {j['slowest_s']} | "
            f"{s['p50_s']} | {s['p75_s']} | {s['p95_s']} | {s['slowest_s']} | "
            f"{i['mean_bytes_per_s']:.0f} / {i['max_bytes_per_s']:.0f} | {r['load_average'][0]} |"
        )
    lines += [
        "",
        "A join, counted from the first replica that applied it (the joiner's bootstrap peer) instead of the",
        "joiner's own write, which comes before the joiner has dialed anyone; and the time between the two (the",
        "joiner's start-up after its write, its dial and its first push):",
        "",
        "| N | p50 | p75 | p95 | slowest | joiner's write to the first replica |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        j = r["join_from_first_replica"]
        lead = r.get("joiner_lead_s", "")
        lines.append(
            f"| {r['nodes']} | {j['p50_s']} | {j['p75_s']} | {j['p95_s']} | {j['slowest_s']} | {lead} |"
        )
    lines += [
        "",
        "Times in seconds. Targets (ARCHITECTURE section 4): at 128 nodes p95 <= 1 s and slowest <= 3 s;",
        "idle control traffic <= 1 KB/s per node at 10 nodes and <= 2 KB/s at 50.",
        "",
        "![CDF of apply delays](convergence.png)",
    ]
    if result.get("traffic"):
        lines += [
            "",
            "## Control traffic per node",
            "",
            "| N | idle mean B/s | idle max B/s | churn mean B/s | churn max B/s | leave+join pairs | period |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in result["traffic"]:
            i, c = t["idle"], t["churn"]
            lines.append(
                f"| {t['nodes']} | {i['mean_bytes_per_s']:.0f} | {i['max_bytes_per_s']:.0f} | "
                f"{c['mean_bytes_per_s']:.0f} | {c['max_bytes_per_s']:.0f} | {c['leave_join_pairs']} | "
                f"{c['period_s']} s |"
            )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """CDF of apply delays per N, join and model announcement side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, title in (
        (axes[0], "join", "a node joins"),
        (axes[1], "serve_model", "a node serves a model"),
    ):
        for r in result["runs"]:
            d = [x * 1000 for x in r["delays"][key] if x != float("inf")]
            if d:
                ax.plot(d, [(i + 1) / len(d) for i in range(len(d))], label=f"N={r['nodes']}")
        ax.set_title(title)
        ax.set_xlabel("apply delay (ms)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of replicas")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> int:
    """Run every size and write the results."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,16,32,64,128")
    ap.add_argument("--traffic-sizes", default="10,50")
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--churn-seconds", type=float, default=30.0)
    ap.add_argument("--churn-period", type=float, default=2.0)
    ap.add_argument(
        "--events", type=int, default=3, help="joins and model announcements per size (medians kept)"
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = ap.parse_args()
    traffic = []
    for n in [int(x) for x in args.traffic_sizes.split(",") if x]:
        print(f"traffic N={n}...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"otela-traffic-{n}-") as tmp:
            traffic.append(
                await run_traffic(n, args.idle_seconds, args.churn_seconds, args.churn_period, Path(tmp))
            )
        print(f"  {json.dumps(traffic[-1])}", file=sys.stderr)
    runs = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        print(f"N={n}...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"otela-conv-{n}-") as tmp:
            runs.append(await run_size(n, args.idle_seconds, Path(tmp), args.events))
        r = runs[-1]
        print(f"  join {r['join']} model {r['serve_model']}", file=sys.stderr)
    result = {
        "benchmark": "convergence",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "traffic": traffic,
        "runs": runs,
    }
    printable = {**result, "runs": [{k: v for k, v in r.items() if k != "delays"} for r in runs]}
    print(json.dumps(printable, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "convergence.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "convergence.md").write_text(render(result))
    plot(result, out / "convergence.png")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
