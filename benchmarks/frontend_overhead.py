"""Added latency of the API frontend (key check, limits, pending usage row, forward, completed usage row) on top of
the ingress, against calling the ingress directly.

Real processes on loopback: an ingress, one worker with the simulated engine at a fixed latency, and `otela frontend`
on SQLite (or the database given with --db). Requests alternate between the frontend and the ingress, so both paths
see the same machine load. Prints JSON and writes docs/benchmarks/frontend_{sqlite,postgresql}.{json,md}.

    python benchmarks/frontend_overhead.py [--requests 500] [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess, free_port
from opentela.frontend.db import Database
from opentela.frontend.keys import KeySettings, KeyStore

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank, in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] * 1000


def body(stream: bool) -> bytes:
    """A ~1 KB chat request for a few tokens."""
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * 900}],
            "max_tokens": 4,
            "stream": stream,
        }
    ).encode()


async def timed_post(http: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]) -> float:
    """Latency of one POST until the whole body (or stream) is read."""
    t0 = time.perf_counter()
    async with http.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {await resp.text()}")
    return time.perf_counter() - t0


async def interleaved(
    http: aiohttp.ClientSession, front: str, ingress: str, key: str, n: int, stream: bool
) -> dict:
    """One request at a time, alternating paths."""
    data, auth = body(stream), {"Authorization": f"Bearer {key}"}
    via_front, direct = [], []
    for i in range(n):
        pair = [(front, auth, via_front), (ingress, {}, direct)]
        for url, headers, sink in pair if i % 2 else reversed(pair):
            sink.append(await timed_post(http, url + "/v1/chat/completions", data, headers))
    res: dict = {"requests": n, "stream": stream}
    for q in (50, 90, 99):
        res[f"frontend_p{q}_ms"] = round(pct(via_front, q), 3)
        res[f"ingress_p{q}_ms"] = round(pct(direct, q), 3)
        res[f"added_p{q}_ms"] = round(pct(via_front, q) - pct(direct, q), 3)
    res["added_mean_ms"] = round((statistics.mean(via_front) - statistics.mean(direct)) * 1000, 3)
    return res


async def main() -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500, help="requests per path and mode")
    ap.add_argument("--db", help="database URL (default: a SQLite file in a temporary directory)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="where to write results")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp:
        db_url = args.db or f"sqlite:///{tmp}/frontend.db"
        db = await Database.open(db_url)
        _, key = await KeyStore(db).create(KeySettings(name="bench", rpm_limit=100_000, budget_tokens=10**12))
        await db.aclose()
        async with LocalMesh(Path(tmp)) as mesh:
            await mesh.start_ingress("--log-level", "WARNING")
            engine = [
                *OTELA,
                "engine",
                "simulated",
                "--model",
                MODEL,
                "--port",
                str(free_port()),
                "--ttft-ms",
                "2",
                "--itl-ms",
                "0",
                "--default-max-tokens",
                "4",
            ]
            await mesh.add_worker("worker", engine, "--log-level", "WARNING")
            await mesh.wait_serving(MODEL, 1, timeout=60)
            port = free_port()
            front = NodeProcess(
                "frontend",
                [
                    *OTELA,
                    "frontend",
                    "--ingress",
                    mesh.api,
                    "--db",
                    db_url,
                    "--http",
                    f"127.0.0.1:{port}",
                    "--admin-token",
                    "bench",
                    "--log-level",
                    "WARNING",
                ],
                Path(tmp) / "frontend.log",
            )
            await front.start()
            front_url, ingress_url = f"http://127.0.0.1:{port}", mesh.api.removesuffix("/v1")
            try:
                async with aiohttp.ClientSession() as http:
                    await mesh.wait_for(lambda: _up(http, front_url), timeout=60, what="the frontend")
                    print("warming up...", file=sys.stderr)
                    await interleaved(http, front_url, ingress_url, key, 50, False)
                    results = []
                    for stream in (False, True):
                        print(f"{args.requests} requests per path, stream={stream}...", file=sys.stderr)
                        results.append(
                            await interleaved(http, front_url, ingress_url, key, args.requests, stream)
                        )
            finally:
                await front.stop()
    result = {
        "benchmark": "frontend_overhead",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "database": "postgresql" if args.db and args.db.startswith("postgres") else "sqlite",
        "engine": "simulated, fixed 2 ms to the first token, 4 output tokens, ~1 KB request",
        "results": results,
    }
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"frontend_{result['database']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render_markdown(result))
    return 0


async def _up(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/api/info") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def render_markdown(result: dict) -> str:
    """A short human summary of the JSON."""
    lines = [
        "# Overhead of the API frontend",
        "",
        "`benchmarks/frontend_overhead.py`: client -> `otela frontend` (key lookup, limit checks and the pending usage",
        "row in one transaction, forward, usage row completed before the last byte) -> ingress -> worker -> engine,",
        "against calling the ingress directly; real processes on loopback, requests interleaved.",
        f"Engine: {result['engine']}. Database: {result['database']}.",
        f"Machine: {result['machine']['cpus']} CPUs, Python {result['machine']['python']}; load average "
        f"{result['loadavg_before'][0]} before, {result['loadavg_after'][0]} after "
        "(a shared machine: figures are noisy).",
        "",
        "| mode | requests | ingress p50 | frontend p50 | added p50 | ingress p99 | frontend p99 | added p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {'stream' if r['stream'] else 'plain'} | {r['requests']} | {r['ingress_p50_ms']} | "
            f"{r['frontend_p50_ms']} | **{r['added_p50_ms']}** | {r['ingress_p99_ms']} | {r['frontend_p99_ms']} | "
            f"**{r['added_p99_ms']}** |"
        )
    lines += ["", "All times in milliseconds."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        import uvloop

        sys.exit(uvloop.run(main()))
    except ImportError:
        sys.exit(asyncio.run(main()))
