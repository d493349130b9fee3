"""Added latency of the mesh: client -> ingress -> fabric -> serving node -> engine, against the engine directly.

Runs real processes on loopback: an ingress, one worker whose engine is the simulated engine with a fixed latency
(so model speed does not hide the overhead), and this client. Requests alternate between the mesh and the engine
itself, so both paths see the same machine load. Prints JSON and writes docs/benchmarks/overhead.{json,md}.

    python benchmarks/overhead.py [--requests 2000] [--rates 1,4,16,64] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from opentela.fabric.http_tunnel import (
    TunnelRequest,
    TunnelResponseHead,
    encode_request,
    encode_response_head,
)
from opentela.localmesh import OTELA, LocalMesh, free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "x" * 900}], "max_tokens": 1}
).encode()  # ~1 KB request, as in the fabric measurements


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank, in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] * 1000


async def timed_post(http: aiohttp.ClientSession, url: str) -> float:
    """Latency of one POST until the whole body is read."""
    t0 = time.perf_counter()
    async with http.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
    return time.perf_counter() - t0


async def closed_loop(http: aiohttp.ClientSession, mesh_url: str, direct_url: str, n: int) -> dict:
    """One request at a time, alternating paths."""
    mesh, direct = [], []
    for i in range(n):
        if i % 2:
            mesh.append(await timed_post(http, mesh_url))
            direct.append(await timed_post(http, direct_url))
        else:
            direct.append(await timed_post(http, direct_url))
            mesh.append(await timed_post(http, mesh_url))
    return summarize(mesh, direct)


async def open_loop(
    http: aiohttp.ClientSession, mesh_url: str, direct_url: str, rate: float, seconds: float
) -> dict:
    """Poisson arrivals at `rate` req/s on each path, for `seconds`."""
    import random

    rng = random.Random(42)
    mesh: list[float] = []
    direct: list[float] = []
    tasks = []

    async def one(url: str, sink: list[float]) -> None:
        sink.append(await timed_post(http, url))

    start = time.perf_counter()
    t = 0.0
    while t < seconds:
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(mesh_url, mesh)))
        tasks.append(asyncio.create_task(one(direct_url, direct)))
        t += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    out = summarize(mesh, direct)
    out["rate_rps"] = rate
    return out


def summarize(mesh: list[float], direct: list[float]) -> dict:
    """Percentiles of both paths and the added latency at each."""
    res = {"requests": len(mesh)}
    for q in (50, 90, 99):
        res[f"mesh_p{q}_ms"] = round(pct(mesh, q), 3)
        res[f"direct_p{q}_ms"] = round(pct(direct, q), 3)
        res[f"added_p{q}_ms"] = round(pct(mesh, q) - pct(direct, q), 3)
    res["added_mean_ms"] = round((statistics.mean(mesh) - statistics.mean(direct)) * 1000, 3)
    return res


def header_bytes() -> dict:
    """Bytes the mesh adds on the wire per request and per response, beyond the HTTP body."""
    from opentela.fabric import _frames

    request_id = "0" * 32  # a uuid4 hex, as the gateway makes
    tunnel = encode_request(
        TunnelRequest("POST", "/v1/chat/completions", BODY, request_id, {"content-type": "application/json"})
    )
    response = encode_response_head(TunnelResponseHead(200, {"content-type": "application/json"}))
    opening = len(_frames.syn_prefix("/otela/http/1"))
    per_frame = _frames.HEADER_SIZE
    return {
        "request_bytes": len(tunnel) - len(BODY) + opening + per_frame,  # SYN frame + FIN frame
        "response_bytes": len(response) + 2 * per_frame,  # DATA frame + FIN frame
        "note": "tunnel head + frame headers; TLS record overhead not counted",
    }


async def main() -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="closed-loop requests per path")
    ap.add_argument("--rates", default="1,4,16,64", help="open-loop rates (req/s per path)")
    ap.add_argument("--seconds", type=float, default=15.0, help="duration of each open-loop rate")
    ap.add_argument("--ttft-ms", type=float, default=2.0, help="fixed latency of the stand-in engine")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="where to write results")
    args = ap.parse_args()

    engine_port = free_port()
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp:
        async with LocalMesh(Path(tmp)) as mesh:
            await mesh.start_ingress("--log-level", "WARNING")
            engine = [
                *OTELA,
                "engine",
                "simulated",
                "--model",
                MODEL,
                "--port",
                str(engine_port),
                "--ttft-ms",
                str(args.ttft_ms),
                "--itl-ms",
                "0",
                "--default-max-tokens",
                "1",
            ]
            await mesh.add_worker("worker", engine, "--log-level", "WARNING")
            await mesh.wait_serving(MODEL, 1, timeout=60)
            mesh_url = f"{mesh.api}/chat/completions"
            direct_url = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
            connector = aiohttp.TCPConnector(limit=256)
            async with aiohttp.ClientSession(connector=connector) as http:
                print("warming up...", file=sys.stderr)
                await closed_loop(http, mesh_url, direct_url, 200)
                print(f"closed loop, {args.requests} requests per path...", file=sys.stderr)
                sequential = await closed_loop(http, mesh_url, direct_url, args.requests)
                rates = []
                for rate in [float(r) for r in args.rates.split(",") if r]:
                    print(f"open loop at {rate:g} req/s for {args.seconds:g} s...", file=sys.stderr)
                    rates.append(await open_loop(http, mesh_url, direct_url, rate, args.seconds))
    result = {
        "benchmark": "overhead",
        "machine": {
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
            "platform": platform.platform(),
        },
        "engine": f"simulated, fixed {args.ttft_ms} ms, 1 output token, non-streaming, ~1 KB request",
        "sequential": sequential,
        "open_loop": rates,
        "header_bytes": header_bytes(),
    }
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "overhead.md").write_text(render_markdown(result))
    return 0


def render_markdown(result: dict) -> str:
    """A short human summary of the JSON."""
    s = result["sequential"]
    lines = [
        "# Overhead of the mesh",
        "",
        "`benchmarks/overhead.py`: client -> ingress -> fabric stream -> serving node -> engine, against calling the",
        f"same engine directly, on loopback, real processes. Engine: {result['engine']}.",
        f"Machine: {result['machine']['cpus']} CPUs, Python {result['machine']['python']}.",
        "Added latency is the difference of the two paths' percentiles, measured interleaved.",
        "",
        "| load | requests | direct p50 | mesh p50 | added p50 | direct p99 | mesh p99 | added p99 |",
        "|---|---|---|---|---|---|---|---|",
        f"| sequential | {s['requests']} | {s['direct_p50_ms']} | {s['mesh_p50_ms']} | **{s['added_p50_ms']}** | "
        f"{s['direct_p99_ms']} | {s['mesh_p99_ms']} | **{s['added_p99_ms']}** |",
    ]
    for r in result["open_loop"]:
        lines.append(
            f"| {r['rate_rps']:g} req/s | {r['requests']} | {r['direct_p50_ms']} | {r['mesh_p50_ms']} | "
            f"**{r['added_p50_ms']}** | {r['direct_p99_ms']} | {r['mesh_p99_ms']} | **{r['added_p99_ms']}** |"
        )
    hb = result["header_bytes"]
    lines += [
        "",
        "All times in milliseconds.",
        "",
        f"Bytes added on the wire: request {hb['request_bytes']} B, response {hb['response_bytes']} B ({hb['note']}).",
        "",
        "Targets (ARCHITECTURE section 4): added p50 <= 1.0 ms, added p99 at 16 req/s <= 3 ms,",
        "header bytes <= 450 / 120.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        import uvloop

        sys.exit(uvloop.run(main()))
    except ImportError:
        sys.exit(asyncio.run(main()))
