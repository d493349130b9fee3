"""SmolLM2 split over block servers on this machine: tokens/s and per-token latency over 1, 2 and 3 servers,
against the same NumPy code in one process and against the embedded llama.cpp engine, with the fabric's share.

Every setup runs at once on loopback (real node processes; the embedded engine as its own process), and the
rounds interleave them (one request per setup per round), so a busy moment of the shared machine hits all of
them alike. Each request is a greedy streamed completion of `--tokens` new tokens; per-token latency is the
median gap between streamed tokens after the first, throughput is tokens over the decode time. The fabric's
share comes from the ingress's Server-Timing on non-streamed requests (head: embedding and LM head at the
ingress; blocks: the servers' compute; fabric: the rest of each step's round trips). A last phase sends
`--concurrency` streams at once to the three-server chain, where the servers work on different sessions at
the same time (pipelining).

Prints JSON and writes docs/benchmarks/pipeline.{json,md}.

    python benchmarks/pipeline.py [--rounds 6] [--tokens 64] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from opentela.cli.localmesh import LocalMesh, NodeProcess, embedded_engine_argv, free_port
from opentela.model.local import LocalPipeline
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.model.tokenizer import GGUFTokenizer

ROOT = Path(__file__).resolve().parents[1]
MODEL = SMOLLM2_ID
CHAINS = {
    "1 server": {"b1": (0, 30)},
    "2 servers": {"b1": (0, 15), "b2": (15, 30)},
    "3 servers": {"b1": (0, 10), "b2": (10, 20), "b3": (20, 30)},
}
PROMPTS = [
    "The history of the printing press begins",
    "Write a short poem about the autumn wind:",
    "def quicksort(items):",
    "The main causes of the French Revolution were",
    "Explain photosynthesis to a child:",
    "The best way to learn a new language is",
]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def stream_one(http: aiohttp.ClientSession, url: str, prompt: str, tokens: int) -> dict[str, float]:
    """One greedy streamed completion: time to first token, median gap between the next ones, decode rate."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    stamps: list[float] = []
    count = 0
    async with http.post(f"{url}/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                count = event["usage"]["completion_tokens"]
            if event.get("choices") and event["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    decode = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    return {
        "ttft_ms": (stamps[0] - began) * 1e3 if stamps else float("nan"),
        "token_ms": _median(gaps) * 1e3,
        "tokens": count or len(stamps),
        "decode_tok_s": (len(stamps) - 1) / decode if len(stamps) > 1 else float("nan"),
    }


async def timing_one(http: aiohttp.ClientSession, url: str, prompt: str, tokens: int) -> dict[str, float]:
    """One non-streamed completion: the Server-Timing split of its time, per generated token."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    async with http.post(f"{url}/completions", json=body) as resp:
        resp.raise_for_status()
        answer = await resp.json()
        timing = resp.headers.get("Server-Timing", "")
    n = max(answer["usage"]["completion_tokens"], 1)
    parts = {}
    for item in timing.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if dur:
            parts[name] = float(dur) / n
    return parts


def local_one(pipe: LocalPipeline, ids: list[int], tokens: int) -> dict[str, float]:
    """The same NumPy model in this process: per-token time of its decode steps."""
    began = time.perf_counter()
    out = pipe.generate(ids, tokens)
    total = time.perf_counter() - began
    return {"token_ms": total / max(len(out), 1) * 1e3, "tokens": len(out)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="otela-pipeline-"))
    meshes: dict[str, LocalMesh] = {}
    engine: NodeProcess | None = None
    loadavg_start = os.getloadavg()
    try:
        for label, spans in CHAINS.items():
            mesh = LocalMesh(work / label.replace(" ", "-"))
            await mesh.__aenter__()
            await mesh.start_ingress("--config", str(_server_timing(work)))
            for name, (a, b) in spans.items():
                await mesh.add_worker(name, None, "--blocks", f"{MODEL}:{a}-{b}")
            meshes[label] = mesh
        for label, mesh in meshes.items():
            await _wait_served(mesh, len(CHAINS[label]), label)
        port = free_port()
        argv = embedded_engine_argv(threads=os.cpu_count() or 1, parallel=1)
        argv = [*argv, "--port", str(port)]
        engine = NodeProcess("embedded", argv, work / "embedded.log")
        await engine.start()
        engine_url = f"http://127.0.0.1:{port}/v1"
        tok = GGUFTokenizer(str(default_model_path()))
        pipe = LocalPipeline(str(default_model_path()), splits=[(0, 30)])
        results: dict[str, list[dict[str, float]]] = {k: [] for k in [*CHAINS, "one process", "embedded"]}
        timings: dict[str, list[dict[str, float]]] = {k: [] for k in CHAINS}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            await _wait_engine(http, engine_url)
            for r in range(args.rounds):
                prompt = PROMPTS[r % len(PROMPTS)]
                for label, mesh in meshes.items():
                    results[label].append(await stream_one(http, mesh.api, prompt, args.tokens))
                    timings[label].append(await timing_one(http, mesh.api, prompt, args.tokens))
                results["one process"].append(
                    await asyncio.to_thread(local_one, pipe, tok.encode(prompt), args.tokens)
                )
                results["embedded"].append(await stream_one(http, engine_url, prompt, args.tokens))
            three = meshes["3 servers"].api
            began = time.perf_counter()
            together = await asyncio.gather(
                *(
                    stream_one(http, three, PROMPTS[i % len(PROMPTS)], args.tokens)
                    for i in range(args.concurrency)
                )
            )
            wall = time.perf_counter() - began
        summary = {
            label: {
                "token_ms_p50": round(_median([x["token_ms"] for x in rows]), 2),
                "tokens_per_s": round(1000 / _median([x["token_ms"] for x in rows]), 1),
                **(
                    {"ttft_ms_p50": round(_median([x["ttft_ms"] for x in rows]), 1)}
                    if "ttft_ms" in rows[0]
                    else {}
                ),
            }
            for label, rows in results.items()
        }
        for label, rows in timings.items():
            share = {
                k: round(_median([row.get(k, 0.0) for row in rows]), 3) for k in ("head", "blocks", "fabric")
            }
            total = sum(share.values()) or 1.0
            summary[label]["per_token_ms"] = share
            summary[label]["fabric_share"] = round(share["fabric"] / total, 3)
        summary["3 servers, concurrent"] = {
            "streams": args.concurrency,
            "aggregate_tokens_per_s": round(sum(x["tokens"] for x in together) / wall, 1),
            "token_ms_p50": round(_median([x["token_ms"] for x in together]), 2),
        }
        return {
            "model": MODEL,
            "tokens": args.tokens,
            "rounds": args.rounds,
            "summary": summary,
            "loadavg": [round(x, 2) for x in loadavg_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
        }
    finally:
        if engine is not None:
            await engine.stop()
        for mesh in meshes.values():
            await mesh.aclose()


def _server_timing(work: Path) -> Path:
    path = work / "ingress.toml"
    path.write_text("[gateway]\nserver_timing = true\n")
    return path


async def _wait_served(mesh: LocalMesh, servers: int, label: str) -> None:
    async def probe() -> bool:
        return await _served(mesh, servers)

    await mesh.wait_for(probe, timeout=120, what=label)


async def _served(mesh: LocalMesh, servers: int) -> bool:
    listing = await mesh.get_json("/models") or {"data": []}
    entry = next((m for m in listing["data"] if m["id"] == MODEL), None)
    return bool(entry and entry.get("split") and len(entry["block_servers"]) >= servers)


async def _wait_engine(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        try:
            async with http.get(f"{url}/models") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("the embedded engine did not start")


def write_docs(result: dict[str, Any]) -> None:
    """docs/benchmarks/pipeline.{json,md}."""
    out = ROOT / "docs" / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    rows = []
    for label in [*CHAINS, "one process", "embedded"]:
        row = s[label]
        share = row.get("per_token_ms", {})
        rows.append(
            f"| {label} | {row['token_ms_p50']:.1f} | {row['tokens_per_s']:.1f} | {row.get('ttft_ms_p50', '-')} | "
            + (
                f"{share['head']:.2f} / {share['blocks']:.2f} / {share['fabric']:.2f} | {row['fabric_share']:.0%} |"
                if share
                else "- | - |"
            )
        )
    c = s["3 servers, concurrent"]
    text = f"""# Pipeline: SmolLM2 split over block servers

`benchmarks/pipeline.py`, {result["rounds"]} interleaved rounds of greedy {result["tokens"]}-token completions;
{result["cpus"]} CPUs, load average {result["loadavg"][0]:.2f} at the start and {result["loadavg_end"][0]:.2f} at the
end. Every setup runs at once on loopback; absolute times depend on this shared machine, compare the rows.

| setup | ms per token (p50) | tokens/s | TTFT ms (p50) | head / blocks / fabric ms per token | fabric share |
|---|---|---|---|---|---|
{chr(10).join(rows)}

- *one process*: the same NumPy blocks, embedding and head in one Python process (model/local.py), no fabric.
- *embedded*: llama.cpp (xllamacpp) serving the same model from its Q4_1 GGUF, the platform's default engine.
- *head / blocks / fabric*: the ingress's Server-Timing per generated token: embedding and LM head at the ingress,
  the block servers' compute, and the rest of every step's round trips (framing, the mux, loopback TCP, the
  servers' event loops).

{c["streams"]} concurrent streams over the 3-server chain: {c["aggregate_tokens_per_s"]:.1f} tokens/s in all,
{c["token_ms_p50"]:.1f} ms per token each (the servers work on different sessions' steps at the same time).
"""
    (out / "pipeline.md").write_text(text)


def main() -> None:
    """Run the benchmark, print JSON, write the summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--no-docs", action="store_true", help="print only")
    args = p.parse_args()
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout, indent=2)
    print()
    if not args.no_docs:
        write_docs(result)


if __name__ == "__main__":
    main()
