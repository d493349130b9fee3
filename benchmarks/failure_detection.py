"""SWIM failure detection with N real node processes on loopback, at the default settings unless told otherwise.

Two kinds of failure, several trials each, one random worker per trial:
  - crash: SIGKILL (the kernel resets the node's connections, so probes fail at once),
  - hang:  SIGSTOP (connections stay open and nothing answers: probes and indirect probes time out).
For each trial it measures the time from the signal to
  - the ingress suspecting the session (polling /v1/dnt/peers),
  - every other replica applying the LEFT record (from each node's trace of applied changes),
and for hangs whether the node, resumed after its eviction, came back under a new session.
Prints JSON and writes docs/benchmarks/failure_detection.{json,md}.

    python benchmarks/failure_detection.py [--nodes 10] [--trials 3] [--suspicion-timeout 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convergence import percentiles, read_traces, wait_all_know

from opentela.cli.localmesh import LocalMesh

ROOT = Path(__file__).resolve().parents[1]


async def watched(mesh: LocalMesh) -> list[dict[str, Any]]:
    """The ingress's SWIM members."""
    return [p for p in await mesh.get_json("/dnt/peers") or [] if p.get("session_id")]


async def session_of(mesh: LocalMesh, name: str) -> str:
    """The current session of a node, by its provider id (= its name here)."""
    for record in await mesh.get_json("/dnt/table") or []:
        if record["provider_id"] == name and record["lifecycle"] in ("JOIN", "SERVING"):
            return record["session_id"]
    raise RuntimeError(f"no live session for {name}")


async def trial(
    mesh: LocalMesh, trace_dir: Path, victim: str, kind: str, timeout: float, dead: set[str]
) -> dict[str, Any]:
    """Fail one node and time suspicion at the ingress and LEFT at every replica not in `dead` (trace names)."""
    session = await session_of(mesh, victim)
    dead.add(session)
    node = mesh.nodes[victim]
    t0 = time.time()
    node.signal(signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
    suspected_s = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if suspected_s is None and any(
            p["session_id"] == session and p["suspected"] for p in await watched(mesh)
        ):
            suspected_s = time.time() - t0
        left_at = {
            o: min((r[0] for r in rows if r[1] == session and r[2] == "LEFT"), default=None)
            for o, rows in read_traces(trace_dir).items()
            if o not in dead
        }
        if suspected_s is not None and left_at and all(v is not None for v in left_at.values()):
            break
        await asyncio.sleep(0.05)
    else:
        raise TimeoutError(f"{victim} ({kind}) was not evicted everywhere within {timeout} s")
    result: dict[str, Any] = {
        "kind": kind,
        "suspected_at_ingress_s": round(suspected_s, 3),
        "left_everywhere": percentiles([v - t0 for v in left_at.values() if v is not None]),
    }
    if kind == "hang":
        node.signal(signal.SIGCONT)

        async def rejoined() -> str | None:
            try:
                fresh = await session_of(mesh, victim)
            except RuntimeError:
                return None
            return fresh if fresh != session else None

        t1 = time.time()
        await mesh.wait_for(rejoined, timeout=60, what=f"{victim} to rejoin", interval=0.05)
        result["rejoined_after_resume_s"] = round(time.time() - t1, 3)
        node.signal(signal.SIGKILL)  # out of the way of the next trial
        await _wait_left_everywhere(mesh, victim)
    return result


async def _wait_left_everywhere(mesh: LocalMesh, name: str) -> None:
    async def gone() -> bool:
        table = await mesh.get_json("/dnt/table") or []
        return not any(r["provider_id"] == name and r["lifecycle"] in ("JOIN", "SERVING") for r in table)

    await mesh.wait_for(gone, timeout=120, what=f"{name} gone", interval=0.2)


async def run(n: int, trials: int, suspicion_timeout: float, workdir: Path, seed: int) -> dict[str, Any]:
    """One mesh of n nodes, `trials` crashes then `trials` hangs."""
    trace_dir = workdir / "traces"
    env = {
        **os.environ,
        "OTELA_NODE_TRACE_DIR": str(trace_dir),
        "OTELA_LOG_LEVEL": "WARNING",
        "OTELA_REGISTRY_SUSPICION_TIMEOUT": str(suspicion_timeout),
    }
    rng = random.Random(seed)
    async with LocalMesh(workdir, env=env) as mesh:
        await mesh.start_ingress("--log-level", "WARNING")
        names = [f"n{i}" for i in range(n - 1)]
        for name in names:
            await mesh.add_worker(name, None, "--log-level", "WARNING")
        await wait_all_know(trace_dir, n, timeout=120 + 3 * n)
        await asyncio.sleep(3)
        victims = rng.sample(names, 2 * trials)
        results, dead = [], set()
        for i, victim in enumerate(victims):
            kind = "crash" if i < trials else "hang"
            print(f"  {kind} {victim}...", file=sys.stderr)
            results.append(
                await trial(mesh, trace_dir, victim, kind, timeout=6 * suspicion_timeout + 30, dead=dead)
            )
        return {"nodes": n, "suspicion_timeout_s": suspicion_timeout, "trials": results}


def render(result: dict[str, Any]) -> str:
    """Markdown summary."""
    r = result["run"]
    lines = [
        "# Failure detection (SWIM)",
        "",
        "`benchmarks/failure_detection.py`: N real `otela start` processes on loopback at the default probe settings",
        "(probe every 1 s, direct timeout 0.5 s, 3 indirect probes),",
        f"suspicion timeout {r['suspicion_timeout_s']:g} s.",
        "A *crash* is SIGKILL (connections reset); a *hang* is SIGSTOP (connections open, nothing answers).",
        "Times in seconds from the signal. Machine: "
        f"{result['machine']['cpus']} CPUs, load average {result['machine']['loadavg_before']} before the run.",
        "",
        f"N = {r['nodes']}",
        "",
        "| failure | suspected at the ingress | LEFT at every replica: p50 | p95 | slowest | rejoined after resume |",
        "|---|---|---|---|---|---|",
    ]
    for t in r["trials"]:
        left = t["left_everywhere"]
        lines.append(
            f"| {t['kind']} | {t['suspected_at_ingress_s']} | {left['p50_s']} | {left['p95_s']} | "
            f"{left['slowest_s']} | {t.get('rejoined_after_resume_s', '')} |"
        )
    lines += [
        "",
        "Eviction is due `suspicion_timeout` after a witness suspects the session; the LEFT record then spreads by",
        "push and anti-entropy. A hung node resumed after its eviction sees the LEFT record for its own session and",
        "rejoins under a new session id.",
    ]
    return "\n".join(lines) + "\n"


async def main() -> int:
    """Run and write the results."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--suspicion-timeout", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = ap.parse_args()
    machine = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="otela-swim-") as tmp:
        run_result = await run(args.nodes, args.trials, args.suspicion_timeout, Path(tmp), args.seed)
    machine["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result = {"benchmark": "failure_detection", "machine": machine, "run": run_result}
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "failure_detection.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "failure_detection.md").write_text(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
