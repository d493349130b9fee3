"""Prefix affinity against random routing on multi-turn conversations: time to first token with two replicas of
the embedded SmolLM2 engine (llama.cpp), which reuse the KV cache of a prompt they served before.

The trace is synthetic: K conversations of T turns, each with its own system prompt of filler sentences; every
turn appends a user question of filler words to the conversation so far (the previous answers included), so
prompts grow to a few hundred tokens. A run replays K fresh conversations at once (each conversation's turns one
after the other, the next sent when the previous answer is in) through one ingress, with every request naming
the policy in `X-Otela-Policy`. Rounds interleave the policies (alternating which goes first), and every run
starts with a tag of its own, so no run finds the cache of another. Reported per policy: TTFT p50 and p90 (the
first streamed content), over all turns and over turns 2+ (where a cached prefix can help), the share of prompt
tokens the engine found cached (llama.cpp's `usage.prompt_tokens_details.cached_tokens`), and how often a turn
went to the replica of the turn before; with the load average.

Prints JSON and writes docs/benchmarks/prefix_affinity.{json,md}.

    python benchmarks/prefix_affinity.py [--conversations 4] [--turns 6] [--rounds 4] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from opentela.cli.localmesh import LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("prefix_affinity", "random")
WORDS = (
    "garden river window quiet market paper winter signal copper lantern harbor meadow engine pencil orbit "
    "canvas thunder ladder velvet silver planet bridge forest candle marble rocket valley pocket mirror cotton "
    "island shadow summer basket needle button castle wagon hollow timber circle saddle puzzle anchor kettle"
).split()


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def system_prompt(tag: str, rng: random.Random, sentences: int) -> str:
    """A conversation's own system prompt: the run's tag first, so no two runs share a cached prefix."""
    body = " ".join(_sentence(rng, 10) for _ in range(sentences))
    return f"Session {tag}. You are a concise assistant. Background notes: {body}"


def question(turn: int, rng: random.Random, words: int) -> str:
    """One user turn of filler words."""
    return f"Question {turn + 1}: {_sentence(rng, words)[:-1]}? Answer in a few words."


def _pct(xs: list[float], q: float) -> float:
    """The q-quantile (0 < q < 1), interpolated between the observations."""
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]


async def turn_once(
    http: aiohttp.ClientSession, api: str, policy: str, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """One streamed chat turn: TTFT, the answer's text, usage and the replica that served it."""
    body = {
        "model": MODEL_ID,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    ttft, text, usage = float("nan"), [], {}
    async with http.post(f"{api}/chat/completions", json=body, headers={"X-Otela-Policy": policy}) as resp:
        resp.raise_for_status()
        session = resp.headers.get("X-Otela-Session", "")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not text:
                        ttft = time.perf_counter() - began
                    text.append(piece)
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_ms": ttft * 1e3,
        "e2e_ms": (time.perf_counter() - began) * 1e3,
        "answer": "".join(text),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "cached_tokens": int(details.get("cached_tokens", 0)),
        "session": session,
    }


async def conversation(
    http: aiohttp.ClientSession, api: str, policy: str, tag: str, seed: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Replay one conversation turn by turn; one row per turn."""
    rng = random.Random(seed)  # the same seed for both policies: the same lengths, different tags
    messages = [{"role": "system", "content": system_prompt(tag, rng, args.system_sentences)}]
    rows = []
    for t in range(args.turns):
        messages.append({"role": "user", "content": question(t, rng, args.question_words)})
        row = await turn_once(http, api, policy, messages, args.max_tokens)
        messages.append({"role": "assistant", "content": row.pop("answer")})
        rows.append({"turn": t + 1, **row})
    for before, after in itertools.pairwise(rows):
        after["same_replica"] = after["session"] == before["session"]
    return rows


def retried_requests(access_log: str) -> dict[str, int]:
    """Requests that needed more than one attempt, by policy, from the ingress's access log."""
    out: dict[str, int] = {}
    for attempts, policy in re.findall(r"attempts=(\d+) policy=(\w+)", access_log):
        if int(attempts) > 1:
            out[policy] = out.get(policy, 0) + 1
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT percentiles, cached share and stickiness of one policy's rows."""
    later = [r for r in rows if r["turn"] > 1]
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {
        "requests": len(rows),
        "ttft_ms_p50": round(_pct([r["ttft_ms"] for r in rows], 0.5), 1),
        "ttft_ms_p90": round(_pct([r["ttft_ms"] for r in rows], 0.9), 1),
        "ttft_ms_p50_turn2plus": round(_pct([r["ttft_ms"] for r in later], 0.5), 1),
        "ttft_ms_p90_turn2plus": round(_pct([r["ttft_ms"] for r in later], 0.9), 1),
        "e2e_ms_p50": round(_pct([r["e2e_ms"] for r in rows], 0.5), 1),
        "prompt_tokens_mean": round(prompt / max(len(rows), 1), 1),
        "prompt_tokens_max": max((r["prompt_tokens"] for r in rows), default=0),
        "cached_share": round(sum(r["cached_tokens"] for r in rows) / max(prompt, 1), 3),
        "same_replica_share": round(sum(r["same_replica"] for r in later) / max(len(later), 1), 3),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the mesh, warm it, replay the interleaved rounds and summarize."""
    work = Path(tempfile.mkdtemp(prefix="otela-prefix-affinity-"))
    env = {"OTELA_GATEWAY_REQUEST_POLICIES": ",".join(POLICIES)}
    async with LocalMesh(work) as mesh:
        await mesh.start_ingress("--policy", "prefix_affinity", env=env)
        argv = embedded_engine_argv(threads=args.threads, parallel=args.parallel)
        for name in ("worker-a", "worker-b"):
            await mesh.add_worker(name, argv)
        await mesh.wait_serving(MODEL_ID, 2, timeout=180)
        loadavg_start = os.getloadavg()
        rows: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            warm = [{"role": "user", "content": "Say hello."}]
            await asyncio.gather(*(turn_once(http, mesh.api, "random", warm, 2) for _ in range(4)))
            for r in range(args.rounds):
                order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                for policy in order:
                    runs = await asyncio.gather(
                        *(
                            conversation(http, mesh.api, policy, f"{r}-{policy}-{c}", 1000 * r + c, args)
                            for c in range(args.conversations)
                        )
                    )
                    for c, turns in enumerate(runs):
                        rows[policy] += [{"round": r + 1, "conversation": c + 1, **t} for t in turns]
        stats = (await mesh.get_json("/dnt/stats") or {}).get("gateway", {}).get("policy_stats", {})
        loadavg_end = os.getloadavg()
        retried = retried_requests(mesh.nodes["ingress"].log_text())
        failures = sorted(
            {
                kind
                for name in ("worker-a", "worker-b")
                for kind in re.findall(r"engine failed request \w+: (\w+)", mesh.nodes[name].log_text())
            }
        )
    per_turn = {
        p: [
            round(_pct([r["ttft_ms"] for r in rows[p] if r["turn"] == t], 0.5), 1)
            for t in range(1, args.turns + 1)
        ]
        for p in POLICIES
    }
    return {
        "trace": "synthetic",
        "model": MODEL_ID,
        "settings": {
            k: getattr(args, k)
            for k in (
                "conversations",
                "turns",
                "rounds",
                "max_tokens",
                "system_sentences",
                "question_words",
                "threads",
                "parallel",
            )
        },
        "summary": {p: {**summarize(rows[p]), "retried": retried.get(p, 0)} for p in POLICIES},
        "ttft_ms_p50_by_turn": per_turn,
        "ingress_policy_stats": stats,
        "engine_failures": failures,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_start": [round(x, 2) for x in loadavg_start],
            "loadavg_end": [round(x, 2) for x in loadavg_end],
        },
        "rows": rows,
    }


def render_markdown(result: dict[str, Any]) -> str:
    """The page docs/benchmarks/prefix_affinity.md."""
    s, m, cfg = result["summary"], result["machine"], result["settings"]
    a, r = s["prefix_affinity"], s["random"]
    lines = [
        "# Prefix affinity: multi-turn conversations on two llama.cpp replicas",
        "",
        "`benchmarks/prefix_affinity.py`. The routing policy `prefix_affinity` sends a conversation's next turn to",
        "the replica that served the turn before, whose engine still holds the prompt's KV cache",
        "([gateway.md](../gateway.md#prefix-affinity)); `random`, the paper's default, ignores it. An ingress and two",
        f"workers on loopback, each running the embedded SmolLM2-135M (llama.cpp, {cfg['threads']} thread, "
        f"{cfg['parallel']} slots, its prompt cache on).",
        "",
        f"**The trace is synthetic**: {cfg['conversations']} conversations at once, {cfg['turns']} turns each. Each "
        "conversation has a system prompt",
        f"of {cfg['system_sentences']} filler sentences; each turn appends a question of {cfg['question_words']} "
        "filler words to the conversation so far,",
        f"previous answers included ({cfg['max_tokens']} tokens at most, greedy). Prompts grow from about "
        f"{min(_first_prompts(result))} to {a['prompt_tokens_max']} tokens.",
        f"{cfg['rounds']} rounds interleave the policies (which goes first alternates); each run has fresh "
        "conversations whose first",
        "words differ, so no run reuses another's cache, and both policies get the same lengths.",
        f"Machine: {m['cpus']} CPUs, shared with other work; load average {m['loadavg_start'][0]} at the start and "
        f"{m['loadavg_end'][0]} at the end.",
        "Absolute times depend on this machine: compare the rows.",
        "",
        "| policy | requests | TTFT p50 ms | TTFT p90 ms | turns 2+: TTFT p50 ms | turns 2+: TTFT p90 ms | "
        "prompt tokens found cached | turns on the previous turn's replica | retried |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in (("prefix_affinity", a), ("random", r)):
        lines.append(
            f"| `{name}` | {row['requests']} | {row['ttft_ms_p50']} | {row['ttft_ms_p90']} | "
            f"{row['ttft_ms_p50_turn2plus']} | {row['ttft_ms_p90_turn2plus']} | {row['cached_share']:.0%} | "
            f"{row['same_replica_share']:.0%} | {row['retried']} |"
        )
    turns = result["ttft_ms_p50_by_turn"]
    lines += [
        "",
        "TTFT p50 (ms) by turn:",
        "",
        "| turn | " + " | ".join(str(t + 1) for t in range(len(turns["random"]))) + " |",
        "|---|" + "---|" * len(turns["random"]),
        "| `prefix_affinity` | " + " | ".join(str(x) for x in turns["prefix_affinity"]) + " |",
        "| `random` | " + " | ".join(str(x) for x in turns["random"]) + " |",
        "",
        _reading(a, r),
        "",
        "- *prompt tokens found cached*: the engine's own count (`usage.prompt_tokens_details.cached_tokens`) over",
        "  all prompt tokens; llama.cpp also keeps earlier prompts in host memory, so `random` finds some too when a",
        "  turn returns to a replica that served the conversation before.",
        "- The ingress's counters after the runs (`/v1/dnt/stats`, `policy_stats.prefix_affinity`): "
        + ", ".join(f"{k} {v}" for k, v in result["ingress_policy_stats"].get("prefix_affinity", {}).items())
        + " (they count the picks of `prefix_affinity` requests only).",
        "- `random` also spreads the conversations' turns unevenly at times, so some of its TTFT is queueing behind",
        "  another conversation on the same replica; `prefix_affinity` places new conversations by load.",
        "- *retried*: requests the ingress moved to the other replica after the first attempt failed (from its access",
        "  log). A retried `prefix_affinity` turn leaves its replica, and the conversation then stays on the new one.",
    ]
    if result["engine_failures"]:
        lines += [
            f"  The failures in this run: {', '.join(result['engine_failures'])} between a worker and its engine, "
            "as the",
            "  request was written (from the workers' logs), whatever the policy.",
        ]
    return "\n".join([*lines, ""])


def _first_prompts(result: dict[str, Any]) -> list[int]:
    return [r["prompt_tokens"] for rows in result["rows"].values() for r in rows if r["turn"] == 1] or [0]


def _reading(a: dict[str, Any], r: dict[str, Any]) -> str:
    ratio = (
        r["ttft_ms_p50_turn2plus"] / a["ttft_ms_p50_turn2plus"]
        if a["ttft_ms_p50_turn2plus"]
        else float("nan")
    )
    return (
        f"From the second turn on, `random`'s median TTFT is {ratio:.2f}x `prefix_affinity`'s "
        f"({r['ttft_ms_p50_turn2plus']} ms against {a['ttft_ms_p50_turn2plus']} ms;\np90 "
        f"{r['ttft_ms_p90_turn2plus']} ms against {a['ttft_ms_p90_turn2plus']} ms): with affinity the engine found "
        f"{a['cached_share']:.0%} of prompt tokens cached, against {r['cached_share']:.0%}."
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=4, help="conversations replayed at once per run")
    ap.add_argument("--turns", type=int, default=6, help="turns per conversation")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (one run per policy each)")
    ap.add_argument("--max-tokens", type=int, default=8, help="answer length cap per turn")
    ap.add_argument("--system-sentences", type=int, default=8, help="filler sentences in each system prompt")
    ap.add_argument("--question-words", type=int, default=18, help="filler words per question")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads per replica")
    ap.add_argument("--parallel", type=int, default=2, help="llama.cpp slots per replica")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="where to write results")
    args = ap.parse_args()
    result = await run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix_affinity.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "prefix_affinity.md").write_text(render_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
