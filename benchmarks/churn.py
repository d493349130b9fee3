"""Churn: six workers with simulated engines, killed and restarted at random under steady load.

An ingress and six workers run as real processes on loopback; each worker's engine is the simulated engine
(a declared GPU's timing, a few sequences at once, so the replicas and not the client are the bottleneck).
Closed-loop users keep a steady stream of requests going (mostly non-streaming, some streaming) while every few
seconds a random live worker is SIGKILLed together with its engine, as a preempted job would be, and dead ones
come back after a few seconds under a new session. Reported: user-facing errors (zero expected for
non-streaming requests), and throughput over time against the number of live replicas (the paper's Figure 4).
Prints JSON and writes docs/benchmarks/churn.{json,md,png}.

    python benchmarks/churn.py [--seconds 180] [--users 16] [--interval 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from opentela.bench.load import LoadSettings, send_one
from opentela.bench.report import Outcome
from opentela.bench.workload import PlannedRequest
from opentela.cli.localmesh import OTELA, LocalMesh

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama-3.1-8b"
WORKERS = 6


def engine_argv(args: argparse.Namespace) -> list[str]:
    """A simulated engine: fixed timing so capacity per replica is known, a few sequences at once."""
    return [
        *OTELA, "engine", "simulated", "--model", MODEL, "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
        "--max-concurrency", str(args.slots),
    ]  # fmt: skip


class Churn:
    """Kills a random live worker every interval (keeping at least `min_live`) and revives dead ones later."""

    def __init__(self, mesh: LocalMesh, args: argparse.Namespace, rng: random.Random) -> None:
        self.mesh, self.args, self.rng = mesh, args, rng
        self.dead: dict[str, float] = {}  # name -> when to restart
        self.events: list[dict] = []
        self.t0 = 0.0
        self.routable = WORKERS
        """Replicas the ingress can route to, as last sampled."""

    def live(self) -> list[str]:
        """Workers whose process runs."""
        return [
            n
            for n, p in self.mesh.nodes.items()
            if n != "ingress" and p.exited() is None and n not in self.dead
        ]

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: kill on schedule, restart when due."""
        next_kill = time.monotonic() + self.args.interval
        while not stop.is_set():
            now = time.monotonic()
            for name, due in list(self.dead.items()):
                if now >= due:
                    await self.mesh.nodes[name].stop(timeout=1)  # reap the killed one and close its log
                    await self.mesh.add_worker(name, engine_argv(self.args), "--log-level", "WARNING")
                    del self.dead[name]
                    self.events.append({"t": round(now - self.t0, 2), "event": "restart", "node": name})
            if now >= next_kill:
                live = self.live()
                # Keep `min_live` replicas able to serve: a restarted process counts only once it serves again,
                # or churn could take the whole capacity away and every request would rightly fail.
                if len(live) > self.args.min_live and self.routable > self.args.min_live:
                    victim = self.rng.choice(live)
                    self.mesh.nodes[victim].signal(signal.SIGKILL, group=True)
                    self.dead[victim] = now + self.rng.uniform(self.args.down_min, self.args.down_max)
                    self.events.append({"t": round(now - self.t0, 2), "event": "kill", "node": victim})
                next_kill = now + self.args.interval * self.rng.uniform(0.5, 1.5)
            await asyncio.sleep(0.1)


async def sample_replicas(mesh: LocalMesh, churn: Churn, stop: asyncio.Event, out: list[dict]) -> None:
    """Twice a second: live worker processes, and replicas the ingress would route to."""
    while not stop.is_set():
        reps = await mesh.replicas(MODEL)
        table = await mesh.get_json("/dnt/table") or []
        newest: dict[str, dict] = {}
        for rec in table:  # a restarted worker keeps its peer id; only its newest session counts
            if rec["peer_id"] not in newest or rec["started_at"] > newest[rec["peer_id"]]["started_at"]:
                newest[rec["peer_id"]] = rec
        current = {rec["session_id"] for rec in newest.values()}
        routable = sum(
            1 for r in reps if r["state"] == "SERVING" and not r["suspected"] and r["session_id"] in current
        )
        churn.routable = routable
        out.append(
            {"t": round(time.monotonic() - churn.t0, 2), "live": len(churn.live()), "routable": routable}
        )
        await asyncio.sleep(0.5)


async def user(
    http: aiohttp.ClientSession, api: str, args: argparse.Namespace, rng: random.Random, stop: asyncio.Event,
    t0: float, out: list[tuple[bool, Outcome]],
) -> None:  # fmt: skip
    """One closed-loop user: a request, then the next as soon as it is answered."""
    while not stop.is_set():
        stream = rng.random() < args.stream_share
        settings = LoadSettings(url=api, model=MODEL, stream=stream, timeout=120)
        outcome = await send_one(
            http, settings, PlannedRequest(0.0, args.input_tokens, args.output_tokens), t0
        )
        out.append((stream, outcome))


async def run(args: argparse.Namespace) -> dict:
    """Start the mesh, load it, churn it, and collect."""
    rng = random.Random(args.seed)
    loadavg_start = os.getloadavg()
    outcomes: list[tuple[bool, Outcome]] = []
    samples: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="otela-churn-") as tmp:
        workdir = Path(args.keep_logs) if args.keep_logs else Path(tmp)
        async with LocalMesh(workdir) as mesh:
            await mesh.start_ingress("--log-level", "INFO" if args.keep_logs else "WARNING")
            for i in range(WORKERS):
                await mesh.add_worker(f"worker-{i}", engine_argv(args), "--log-level", "WARNING")
            await mesh.wait_serving(MODEL, WORKERS, timeout=120)
            churn = Churn(mesh, args, rng)
            stop = asyncio.Event()
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as http:
                t0 = time.perf_counter()
                churn.t0 = time.monotonic()
                tasks = [
                    asyncio.create_task(
                        user(http, mesh.api, args, random.Random(args.seed + i), stop, t0, outcomes)
                    )
                    for i in range(args.users)
                ]
                tasks.append(asyncio.create_task(churn.run(stop)))
                tasks.append(asyncio.create_task(sample_replicas(mesh, churn, stop, samples)))
                for second in range(int(args.seconds)):
                    await asyncio.sleep(1)
                    if second % 10 == 9:
                        bad = sum(1 for s, o in outcomes if not o.ok and not s)
                        print(
                            f"  {second + 1:4d} s: {len(outcomes)} requests, live {len(churn.live())}, "
                            f"non-streaming errors {bad}",
                            file=sys.stderr,
                        )
                stop.set()
                await asyncio.gather(*tasks)
                elapsed = time.perf_counter() - t0
                resumes = await stream_resumes(http, mesh.api.removesuffix("/v1") + "/metrics")
    result = analyse(args, outcomes, samples, churn.events, elapsed, loadavg_start)
    result["streaming"]["resumed"] = resumes
    return result


async def stream_resumes(http: aiohttp.ClientSession, url: str) -> int:
    """Streams the ingress resumed on another replica, from its Prometheus counter."""
    async with http.get(url) as resp:
        text = await resp.text()
    counts = [
        line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("otela_stream_resumes_total{")
    ]
    return int(sum(float(c) for c in counts))


def analyse(
    args: argparse.Namespace, outcomes: list[tuple[bool, Outcome]], samples: list[dict], events: list[dict],
    elapsed: float, loadavg_start: tuple[float, float, float],
) -> dict:  # fmt: skip
    """Errors by kind and mode, and a per-second series of throughput and replicas."""
    plain = [o for s, o in outcomes if not s]
    streamed = [o for s, o in outcomes if s]
    seconds = int(elapsed) + 1
    tokens = [0] * seconds
    done = [0] * seconds
    for _, o in outcomes:
        if o.ok:
            end = int(o.sent_at + (o.e2e or 0.0))
            if 0 <= end < seconds:
                tokens[end] += o.output_tokens
                done[end] += 1
    live = [0.0] * seconds
    routable = [0.0] * seconds
    for sec in range(seconds):
        window = [s for s in samples if sec <= s["t"] < sec + 1] or [
            min(samples, key=lambda s: abs(s["t"] - sec))
        ]
        live[sec] = statistics.mean(s["live"] for s in window)
        routable[sec] = statistics.mean(s["routable"] for s in window)
    steady = slice(5, seconds - 2)  # leave out ramp-up and the drain after the load stops
    corr = _correlation(tokens[steady], live[steady])
    corr_routable = _correlation(tokens[steady], routable[steady])
    per_replica = [t / r for t, r in zip(tokens[steady], live[steady], strict=True) if r]
    return {
        "benchmark": "churn",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in loadavg_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "keep_logs")},
        "duration_s": round(elapsed, 1),
        "kills": sum(1 for e in events if e["event"] == "kill"),
        "restarts": sum(1 for e in events if e["event"] == "restart"),
        "non_streaming": {
            "requests": len(plain),
            "errors": sum(1 for o in plain if not o.ok),
            "errors_by_kind": dict(Counter(o.error for o in plain if not o.ok)),
        },
        "streaming": {
            "requests": len(streamed),
            "errors": sum(1 for o in streamed if not o.ok),
            "errors_by_kind": dict(Counter(o.error for o in streamed if not o.ok)),
            "short_answers": sum(1 for o in streamed if o.ok and o.output_tokens != args.output_tokens),
        },
        "throughput": {
            "mean_output_tokens_per_s": round(statistics.mean(tokens[steady]), 1),
            "mean_requests_per_s": round(statistics.mean(done[steady]), 2),
            "tokens_per_s_per_live_replica_mean": round(statistics.mean(per_replica), 1)
            if per_replica
            else None,
            "tokens_per_s_per_live_replica_cv": round(
                statistics.pstdev(per_replica) / statistics.mean(per_replica), 3
            )
            if per_replica
            else None,
            "correlation_tokens_vs_live_replicas": round(corr, 3) if corr is not None else None,
            "correlation_tokens_vs_routable_replicas": round(corr_routable, 3)
            if corr_routable is not None
            else None,
        },
        "series": [
            {
                "second": s,
                "output_tokens": tokens[s],
                "completed": done[s],
                "live": live[s],
                "routable": routable[s],
            }
            for s in range(seconds)
        ],
        "events": events,
    }


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def plot(result: dict, path: Path) -> None:
    """Throughput (tokens/s) and live replicas over time, as in the paper's Figure 4."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]
    t = [s["second"] for s in series]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(
        t, [s["output_tokens"] for s in series], color="tab:red", lw=1.2, label="throughput (output tokens/s)"
    )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s", color="tab:red")
    ax2 = ax.twinx()
    ax2.step(t, [s["live"] for s in series], where="post", color="tab:blue", lw=1.5, label="live replicas")
    ax2.step(
        t, [s["routable"] for s in series], where="post", color="tab:cyan", lw=1, ls="--", label="routable"
    )
    ax2.set_ylabel("replicas", color="tab:blue")
    ax2.set_ylim(0, WORKERS + 0.5)
    for e in result["events"]:
        if e["event"] == "kill":
            ax.axvline(e["t"], color="grey", lw=0.5, alpha=0.5)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="lower left", fontsize=8)
    ns, st = result["non_streaming"], result["streaming"]
    ax.set_title(
        f"{result['kills']} kills in {result['duration_s']:.0f} s; errors: non-streaming {ns['errors']} of "
        f"{ns['requests']}, streaming {st['errors']} of {st['requests']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_markdown(result: dict) -> str:
    """A short human summary of the JSON."""
    s, m, tp = result["settings"], result["machine"], result["throughput"]
    ns, st = result["non_streaming"], result["streaming"]
    return "\n".join(
        [
            "# Churn: nodes killed under load",
            "",
            f"`benchmarks/churn.py`: an ingress and {WORKERS} workers, real processes on loopback, each worker running",
            f"the simulated engine ({s['slots']} sequences at once, TTFT {s['ttft_ms']:g} ms, {s['itl_ms']:g} ms per "
            f"token, {s['output_tokens']} output tokens per request). {s['users']} closed-loop users keep requests",
            f"going ({100 * s['stream_share']:.0f} % streaming) for {result['duration_s']:.0f} s while every "
            f"~{s['interval']:g} s a random live worker is SIGKILLed with its engine (unless only "
            f"{s['min_live']} serve:",
            "churn never takes all capacity away); a killed worker restarts "
            f"{s['down_min']:g}-{s['down_max']:g} s later under a new session.",
            f"Machine: {m['cpus']} CPUs, Python {m['python']}, shared: load average {m['loadavg_start'][0]} at the "
            f"start, {m['loadavg_end'][0]} at the end.",
            "",
            "![throughput and live replicas over time](churn.png)",
            "",
            "| what | figure |",
            "|---|---|",
            f"| kills / restarts | {result['kills']} / {result['restarts']} |",
            f"| non-streaming requests / user-facing errors | {ns['requests']} / **{ns['errors']}**"
            f"{_kinds(ns['errors_by_kind'])} |",
            f"| streaming requests / errors | {st['requests']} / **{st['errors']}**{_kinds(st['errors_by_kind'])} |",
            f"| streams resumed on another replica / answers shorter than asked | {st.get('resumed', 0)} / "
            f"{st['short_answers']} |",
            f"| mean throughput | {tp['mean_output_tokens_per_s']} output tokens/s, "
            f"{tp['mean_requests_per_s']} req/s |",
            f"| throughput per live replica (mean, coefficient of variation) | "
            f"{tp['tokens_per_s_per_live_replica_mean']} tokens/s, {tp['tokens_per_s_per_live_replica_cv']} |",
            "| correlation of per-second throughput with live worker processes / with replicas routable at the "
            f"ingress | {tp['correlation_tokens_vs_live_replicas']} / "
            f"{tp['correlation_tokens_vs_routable_replicas']} |",
            "",
            "*Live* counts worker processes running; *routable* counts replicas the ingress would send to (SERVING,",
            "not suspected, newest session of their peer). A restarted worker is live at once but routable only once",
            "its engine answers and its record has spread, a few seconds later; throughput follows routable.",
            "",
            "Non-streaming requests are retried on another replica before the client sees anything. A stream whose",
            "node dies after its first token is resumed on another replica from the text already delivered",
            "([gateway.md](../gateway.md#streams-that-survive-a-nodes-death)); a client counts an error for an SSE",
            "error event and for a stream that ends without `[DONE]`, and a short answer when the usage total is not",
            "the tokens it asked for (the simulated engine always produces exactly `max_tokens`).",
            "",
            "When no replica can serve, requests fail, as they should: in an earlier run the driver kept two worker",
            "*processes* alive rather than two *serving* replicas, and at a load average near 20 it once left only",
            "restarted workers whose engines were still starting, for about ten seconds: 127 requests got 503",
            "`engine_unavailable`. The driver now only kills while more than `--min-live` replicas serve.",
            "",
            "Target (ARCHITECTURE section 4): zero user-facing errors for non-streaming requests while nodes are",
            "killed, and (issue 12) zero broken streams; throughput that follows the number of live replicas",
            "(paper, Figure 4).",
            "",
        ]
    )


def _kinds(kinds: dict) -> str:
    return " (" + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) + ")" if kinds else ""


async def main() -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=180.0, help="how long to load and churn")
    ap.add_argument("--users", type=int, default=16, help="closed-loop users")
    ap.add_argument("--interval", type=float, default=4.0, help="mean seconds between kills")
    ap.add_argument("--down-min", type=float, default=4.0, help="shortest time a killed worker stays down")
    ap.add_argument("--down-max", type=float, default=12.0, help="longest time a killed worker stays down")
    ap.add_argument(
        "--min-live", type=int, default=2, help="never kill below this many live and serving workers"
    )
    ap.add_argument("--slots", type=int, default=2, help="sequences each engine decodes at once")
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--itl-ms", type=float, default=12.0)
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=40)
    ap.add_argument("--stream-share", type=float, default=0.25, help="fraction of streaming requests")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--keep-logs", metavar="DIR", help="keep every node's log (and the ingress's access log) here"
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="where to write results")
    args = ap.parse_args()
    result = await run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2))
    (out / "churn.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "churn.md").write_text(render_markdown(result))
    try:
        plot(result, out / "churn.png")
    except ImportError:
        print("matplotlib not installed (pip install -e .[bench]): no plot", file=sys.stderr)
    return 0 if result["non_streaming"]["errors"] == 0 and result["streaming"]["errors"] == 0 else 1


if __name__ == "__main__":
    try:
        import uvloop

        sys.exit(uvloop.run(main()))
    except ImportError:
        sys.exit(asyncio.run(main()))
