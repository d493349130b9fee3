"""The mesh's control plane at scale: the registry's real algorithms in a discrete-event simulation.

For each N (default 128, 1,000, 4,000, 10,000) and each mode (full_mesh: today's behaviour, every node probes,
pushes to and exchanges with every other; partial_view: HyParView active and passive views with the connection
limits), a warm mesh is run through an idle window (bytes per node per second, open connections per node,
the bootstrap peers' share), a join (a new node's JOIN record reaching every replica) and a model announcement (a
SERVING version bump). Churn (1 % of the nodes replaced per minute: a crash and a new node that then serves) runs
at --churn-nodes. A validation runs the partial view (--validate-mode) on loopback at 32, 64 and 128 nodes with
this machine's records and compares with the real-process benchmark of the same code
(docs/benchmarks/convergence_partial_views.json; the full mesh against convergence.json); a wire check compares
the simulator's bytes per exchange with what real hosts write on loopback sockets in this process.
Prints JSON and writes docs/benchmarks/scale.{json,md} and scale_*.png.

    python benchmarks/scale.py [--sizes 128,1000,4000,10000] [--modes full_mesh,partial_view] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from opentela.fabric._config import FabricConfig
from opentela.registry.sim import (
    LOOPBACK,
    WAN,
    LinkModel,
    SimConfig,
    WireSizes,
    announce,
    build,
    churn,
    idle,
    join,
    registry_for,
)
from opentela.registry.sim.config import Mode
from opentela.registry.sim.metrics import fit_growth
from opentela.registry.sim.network import KEEPALIVE_PINGS

ROOT = Path(__file__).resolve().parents[1]
CONVERGENCE = ROOT / "docs" / "benchmarks" / "convergence.json"
"""Real processes before partial views: what the full mesh mode is validated against."""
CONVERGENCE_PARTIAL_VIEWS = ROOT / "docs" / "benchmarks" / "convergence_partial_views.json"
"""Real processes with partial views, the default."""


# --- one size -----------------------------------------------------------------------------------------------
def run_size(
    n: int,
    mode: str,
    sizes: WireSizes,
    link: LinkModel,
    idle_seconds: float,
    seed: int,
    lazy_push: bool = True,
) -> dict[str, Any]:
    """Idle window, a join and an announcement on a warm mesh of n nodes."""
    t0, c0 = time.perf_counter(), time.process_time()
    config = SimConfig(nodes=n, mode=mode, link=link, seed=seed, lazy_push=lazy_push)  # type: ignore[arg-type]
    mesh = build(config, sizes)
    built = time.perf_counter() - t0
    quiet = idle(mesh, idle_seconds)
    # The announcement first, on a quiet mesh: right after a join, the joiner is still busy checking the N
    # signed records it pulled, and a change sent to it waits its turn (see docs/benchmarks/scale.md).
    served = announce(mesh)
    joined = join(mesh)
    wall = time.perf_counter() - t0
    out = {
        "nodes": n,
        "mode": mode,
        "idle": quiet,
        "join": joined,
        "serve_model": served,
        "simulated_s": round(mesh.loop.now, 1),
        "events": mesh.loop.events_run,
        "wall_s": round(wall, 1),
        "cpu_s": round(time.process_time() - c0, 1),
        "build_wall_s": round(built, 1),
    }
    print(
        f"  {mode} N={n}: idle {quiet['bytes_per_node_per_s']['mean']:.0f}/{quiet['bytes_per_node_per_s']['max']:.0f}"
        f" B/s, conns {quiet['connections']['mean']}/{quiet['connections']['max']}, join p95"
        f" {joined['p95_s']} s slowest {joined['slowest_s']} s, model p95 {served['p95_s']} s"
        f" ({wall:.0f} s wall, {mesh.loop.events_run} events)",
        file=sys.stderr,
    )
    return out


def run_churn(
    n: int, mode: str, sizes: WireSizes, link: LinkModel, seconds: float, seed: int, lazy_push: bool = True
) -> dict[str, Any]:
    """Churn at 1 % of the nodes per minute."""
    t0 = time.perf_counter()
    config = SimConfig(nodes=n, mode=mode, link=link, seed=seed, lazy_push=lazy_push)  # type: ignore[arg-type]
    mesh = build(config, sizes)
    result = churn(mesh, seconds=seconds, rate=0.01)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["mode"], result["nodes"] = mode, n
    print(
        f"  churn {mode} N={n}: {result['replaced']} replaced, crash resolved p95"
        f" {result['crash_resolved']['p95_s']} s slowest {result['crash_resolved']['slowest_s']} s"
        f" (bound {result['bound_s']} s), routing slowest {result['crash_routing_resolved']['slowest_s']} s,"
        f" traffic mean {result['traffic']['bytes_per_node_per_s']['mean']} max"
        f" {result['traffic']['bytes_per_node_per_s']['max']} B/s (bootstrap max"
        f" {result['traffic']['bootstrap_bytes_per_s']['max']}, others"
        f" {result['traffic']['other_bytes_per_s']['max']}) ({result['wall_s']} s wall)",
        file=sys.stderr,
    )
    return result


# --- validation against real processes ----------------------------------------------------------------------
ANNOUNCE_AFTER_JOIN_S = 5.0
"""Simulated seconds between the validation's join and its model announcement. The real benchmark's announcement
comes from a node started after the join has converged, once its engine is up (seconds later); announced right
after the join, the simulated announcement would also queue behind the joiner's registry pull and view changes."""


def scheduler_slice(cores: int) -> float:
    """Linux's base time slice on a machine of `cores` CPUs: 0.75 ms x (1 + log2(min(cores, 8))), EEVDF's
    `sched_base_slice` (CFS's minimum granularity before it) under the default logarithmic scaling."""
    return 0.00075 * (1 + int(math.log2(min(max(cores, 1), 8))))


def validate(
    sizes_list: list[int],
    per_message: float,
    send_grid: list[float],
    per_record: float,
    per_dial: float,
    seeds: list[int],
    mode: Mode = "partial_view",
    reference: Path = CONVERGENCE_PARTIAL_VIEWS,
    shared_cores: bool = True,
) -> dict[str, Any]:
    """`mode` on loopback with this machine's records against the real processes of `reference` (a
    convergence.py JSON run with the same code). Receiving a message costs `per_message` (the wire check's
    measurement); the cost of sending one (one number) is fitted on the real runs' convergence medians. With
    `shared_cores`, the simulated nodes take turns on the reference machine's cores, as its processes did, each
    turn up to the kernel's time slice; without, each node has a core of its own, its processing stretched by
    the real run's load average over 2 cores."""
    from opentela.node.hardware import probe_hardware

    reference_run = json.loads(reference.read_text())
    real = {r["nodes"]: r for r in reference_run["runs"]}
    cores = int(reference_run.get("machine", {}).get("cpus") or 2) if shared_cores else 0
    slice_s = scheduler_slice(cores) if cores else 0.0
    local = WireSizes.measure(hardware=probe_hardware(use_nvml=False))
    out: dict[str, Any] = {
        "mode": mode,
        "reference": os.path.relpath(reference, ROOT),
        "shared_cores": cores,
        "cpu_slice_s": slice_s,
        "record_bytes": list(local.record),
        "cpu_per_message_s": per_message,
        "cpu_per_record_s": per_record,
        "announce_after_join_s": ANNOUNCE_AFTER_JOIN_S,
        "fits": [],
    }
    best: tuple[float, float] | None = None
    runs_by_cpu: dict[float, list[dict[str, Any]]] = {}
    for send in send_grid:
        runs = []
        for n in sizes_list:
            if n not in real:
                continue
            load = real[n]["load_average"][0]
            link = dataclasses.replace(
                LOOPBACK,
                cpu_per_message=per_message,
                cpu_per_send=send,
                cpu_per_record=per_record,
                cpu_per_dial=per_dial,
                slowdown=1.0 if cores else max(1.0, load / 2),
                cores=cores,
                cpu_slice=slice_s,
            )
            trials = []
            for seed in seeds:
                config = SimConfig(nodes=n, mode=mode, link=link, seed=seed, bootstraps=1, serving=0.0)
                mesh = build(config, local, settle=10.0)
                # The real run's idle window (a busiest node's rate over a shorter window is burstier).
                quiet = idle(mesh, float(real[n]["idle_traffic"].get("seconds", 20.0)))
                # As many rounds as the real run had (each a join, then an announcement), medians over all.
                for _ in range(int(real[n].get("events", 1))):
                    joined = join(mesh)
                    mesh.run(ANNOUNCE_AFTER_JOIN_S)
                    served = announce(mesh)
                    mesh.run(ANNOUNCE_AFTER_JOIN_S)
                    trials.append({"idle": quiet, "join": joined, "serve_model": served})
            runs.append({"nodes": n, "load": load, **_median_trial(trials)})
        runs_by_cpu[send] = runs
        # One parameter, fitted on the convergence medians (join and model p50) over all sizes.
        errors = []
        for r in runs:
            ref = real[r["nodes"]]
            for key in ("join", "serve_model"):
                errors.append(abs(math.log(max(1e-6, r[key]["p50_s"]) / ref[key]["p50_s"])))
        score = sum(errors) / len(errors) if errors else math.inf
        out["fits"].append({"cpu_per_send_s": send, "mean_abs_log_error": round(score, 3)})
        if best is None or score < best[1]:
            best = (send, score)
    assert best is not None
    out["cpu_per_send_s"] = best[0]
    out["runs"] = []
    for r in runs_by_cpu[best[0]]:
        ref = real[r["nodes"]]
        row = {"nodes": r["nodes"], "load": r["load"], "figures": {}}
        pairs = {
            "join p50": (r["join"]["p50_s"], ref["join"]["p50_s"]),
            "join p95": (r["join"]["p95_s"], ref["join"]["p95_s"]),
            "join slowest": (r["join"]["slowest_s"], ref["join"]["slowest_s"]),
            "join p95 from first replica": (
                r["join"]["from_first_replica"]["p95_s"],
                ref["join_from_first_replica"]["p95_s"],
            ),
            "model p50": (r["serve_model"]["p50_s"], ref["serve_model"]["p50_s"]),
            "model p95": (r["serve_model"]["p95_s"], ref["serve_model"]["p95_s"]),
            "model slowest": (r["serve_model"]["slowest_s"], ref["serve_model"]["slowest_s"]),
            "idle mean B/s": (
                r["idle"]["bytes_per_node_per_s"]["mean"],
                ref["idle_traffic"]["mean_bytes_per_s"],
            ),
            "idle max B/s": (
                r["idle"]["bytes_per_node_per_s"]["max"],
                ref["idle_traffic"]["max_bytes_per_s"],
            ),
        }
        for name, (sim, measured) in pairs.items():
            ratio = sim / measured if measured else math.nan
            row["figures"][name] = {
                "sim": sim,
                "real": measured,
                "ratio": round(ratio, 2),
                "within_20pct": bool(abs(ratio - 1) <= 0.2),
            }
        row["idle_by_category"] = r["idle"]["by_category_per_node"]
        out["runs"].append(row)
        print(
            f"  validation N={r['nodes']}: "
            + ", ".join(f"{k} {v['sim']}/{v['real']}" for k, v in row["figures"].items()),
            file=sys.stderr,
        )
    return out


def _median_trial(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-figure median over trials of the figures validation compares."""

    def med(get: Any) -> float:
        values = sorted(get(t) for t in trials)
        return values[len(values) // 2]

    keys = ("p50_s", "p95_s", "slowest_s")
    return {
        "idle": {
            "bytes_per_node_per_s": {
                k: med(lambda t, k=k: t["idle"]["bytes_per_node_per_s"][k]) for k in ("mean", "max")
            },
            "by_category_per_node": trials[0]["idle"]["by_category_per_node"],
        },
        "join": {
            **{k: med(lambda t, k=k: t["join"][k]) for k in keys},
            "from_first_replica": {"p95_s": med(lambda t: t["join"]["from_first_replica"]["p95_s"])},
        },
        "serve_model": {k: med(lambda t, k=k: t["serve_model"][k]) for k in keys},
        "trials": len(trials),
    }


def wire_check(repeat: int = 200) -> dict[str, Any]:
    """Bytes real hosts write per exchange on loopback sockets (this process's write counter) vs the model.

    Under uvloop, as `otela start` runs: libuv writes sockets with write(2), which the kernel's per-process
    counter (/proc/self/io wchar, psutil's write_chars) includes; asyncio's own loop uses send(2), which it
    does not. The convergence benchmark's per-process bytes come from the same counter.
    """
    import uvloop

    return uvloop.run(_wire_check(repeat))


async def _wire_check(repeat: int) -> dict[str, Any]:
    import msgpack

    from opentela._types import Lifecycle
    from opentela.fabric._config import FabricConfig
    from opentela.fabric.host import Host
    from opentela.fabric.identity import Identity
    from opentela.registry._config import RegistryConfig
    from opentela.registry.gossip import Gossip
    from opentela.registry.membership import Membership
    from opentela.registry.record import NodeRecord
    from opentela.registry.registry import Registry
    from opentela.registry.swim import Member

    quiet = RegistryConfig(probe_interval=3600.0, anti_entropy_interval=3600.0)
    nodes = []
    for _ in range(2):
        identity = Identity.generate()
        host = await Host.create(identity, "127.0.0.1:0")
        record = NodeRecord(
            session_id=os.urandom(16).hex(),
            peer_id=identity.peer_id,
            provider_id="p",
            lifecycle=Lifecycle.JOIN,
            version=1,
            addrs=tuple(host.listen_addrs),
        ).signed(identity)
        registry = Registry(identity, record, config=quiet)
        membership = Membership(host, registry, config=quiet)
        gossip = Gossip(host, registry, membership, config=quiet)
        await membership.start()
        await gossip.start()
        nodes.append((host, registry, membership, gossip))
    (ha, ra, ma, ga), (hb, rb, _, _) = nodes
    await ha.connect(hb.listen_addrs[0])
    await asyncio.sleep(1.0)  # the hello exchanges of the new connection
    model = WireSizes.measure()

    def written() -> int:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("wchar"))

    async def per_exchange(action: Any) -> float:
        before = written()
        for _ in range(repeat):
            await action()
            await asyncio.sleep(
                0.005
            )  # apart, as in a live mesh: nothing of one rides in the next one's record
        await asyncio.sleep(0.3)
        return (written() - before) / repeat

    target = Member(rb.session_id, hb.peer_id)
    if await ma.call_ping(target) is None:
        raise RuntimeError("the wire check's ping went unanswered")
    cpu0 = time.process_time()
    probe = await per_exchange(lambda: ma.call_ping(target))
    # Both ends of each probe in this one process: two messages handled, two sent, per exchange.
    cpu_per_message = (time.process_time() - cpu0) / repeat / 2
    same = await per_exchange(lambda: ga._anti_entropy_with(hb.peer_id, hb.listen_addrs))
    rec_bytes = len(msgpack.packb(ra.local.to_wire(), use_bin_type=True))
    push = await per_exchange(lambda: ga._push_to(hb.peer_id, hb.listen_addrs, [ra.local]))
    for host, _, membership, gossip in nodes:
        await gossip.aclose()
        await membership.aclose()
        await host.aclose()
    # A dial between two bare hosts (TLS and identity handshake), then their keepalive on a silent connection.
    fast = FabricConfig(keepalive_interval=1.5, keepalive_timeout=1.0)  # the defaults, 10 times faster
    bare = [await Host.create(Identity.generate(), "127.0.0.1:0", config=fast) for _ in range(2)]
    before, cpu0 = written(), time.process_time()
    await bare[0].connect(bare[1].listen_addrs[0])
    cpu_per_dial = time.process_time() - cpu0  # both ends' handshake work
    await asyncio.sleep(0.2)
    dial = written() - before
    before, began = written(), time.monotonic()
    await asyncio.sleep(15.0)
    intervals = (time.monotonic() - began) / fast.keepalive_interval
    keepalive = (written() - before) / intervals
    for host in bare:
        await host.aclose()
    modelled = {
        "probe": sum(model.probe(model.ping[0], model.ack[0])),
        "anti_entropy_same": sum(model.same()),
        "push": sum(model.push(rec_bytes, 1, 256)),
        "dial": model.handshake_dialer + model.handshake_listener,
        "keepalive_per_interval": 2 * KEEPALIVE_PINGS * model.keepalive,
    }
    measured = {
        "probe": probe,
        "anti_entropy_same": same,
        "push": push,
        "dial": dial,
        "keepalive_per_interval": keepalive,
    }
    return {
        "repeat": repeat,
        "exchanges": {
            k: {
                "model": modelled[k],
                "real": round(measured[k], 1),
                "ratio": round(modelled[k] / measured[k], 3),
            }
            for k in modelled
        },
        "note": "both ends in one process: the write counter holds what both sides sent",
        "cpu_per_message_s": round(cpu_per_message, 6),
        "cpu_per_dial_s": round(cpu_per_dial, 6),
        "cpu_per_record_s": round(record_cost(), 6),
    }


def record_cost(count: int = 2000) -> float:
    """Seconds this machine takes to parse and verify one signed record (what a replica does per record)."""
    import msgpack

    from opentela._types import Lifecycle
    from opentela.fabric.identity import Identity
    from opentela.registry.record import NodeRecord
    from opentela.registry.sim.wire import EXAMPLE_HARDWARE

    identity = Identity.generate()
    record = NodeRecord(
        session_id=os.urandom(16).hex(),
        peer_id=identity.peer_id,
        provider_id="p",
        lifecycle=Lifecycle.JOIN,
        version=1,
        hardware=EXAMPLE_HARDWARE,
    ).signed(identity)
    wire = msgpack.unpackb(msgpack.packb(record.to_wire(), use_bin_type=True), raw=False)
    began = time.process_time()
    for _ in range(count):
        NodeRecord.from_wire(wire).verify()
    return (time.process_time() - began) / count


# --- report -------------------------------------------------------------------------------------------------
FIGURES = {
    "idle_mean": ("idle B/s per node (mean)", lambda r: r["idle"]["bytes_per_node_per_s"]["mean"]),
    "idle_max": ("idle B/s per node (max)", lambda r: r["idle"]["bytes_per_node_per_s"]["max"]),
    "bootstrap_idle": ("bootstrap peer idle B/s (max)", lambda r: r["idle"]["bootstrap_bytes_per_s"]["max"]),
    "conns_mean": ("open connections per node (mean)", lambda r: r["idle"]["connections"]["mean"]),
    "conns_max": ("open connections per node (max)", lambda r: r["idle"]["connections"]["max"]),
    "join_p50": ("join p50 (s)", lambda r: r["join"]["p50_s"]),
    "join_p95": ("join p95 (s)", lambda r: r["join"]["p95_s"]),
    "join_slowest": ("join slowest (s)", lambda r: r["join"]["slowest_s"]),
    "model_p50": ("model p50 (s)", lambda r: r["serve_model"]["p50_s"]),
    "model_p95": ("model p95 (s)", lambda r: r["serve_model"]["p95_s"]),
    "model_slowest": ("model slowest (s)", lambda r: r["serve_model"]["slowest_s"]),
}


def quantiles(delays: list[float], points: int = 100) -> list[float]:
    """Apply delays as percentiles 0..100 (a CDF in 101 numbers, instead of one per replica)."""
    ordered = sorted(delays)
    if not ordered:
        return []
    return [ordered[min(len(ordered) - 1, round(q / points * (len(ordered) - 1)))] for q in range(points + 1)]


def growth(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Fitted growth law of every figure, per mode."""
    out: dict[str, dict[str, Any]] = {}
    for mode in sorted({r["mode"] for r in runs}):
        rows = sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["nodes"])
        out[mode] = {
            key: fit_growth([r["nodes"] for r in rows], [get(r) for r in rows])
            for key, (_, get) in FIGURES.items()
        }
    return out


def plot(result: dict[str, Any], out: Path) -> list[str]:
    """One PNG per group of figures against N (log x), both modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = {
        "scale_traffic.png": (2 * KB, "target: 2 KB/s"),
        "scale_connections.png": (64, "target: 64"),
        "scale_join.png": (2.0, "target: 95 % within 2 s"),
    }
    groups = {
        "scale_traffic.png": (
            "idle traffic per node (B/s)",
            ["idle_mean", "idle_max", "bootstrap_idle"],
            True,
        ),
        "scale_connections.png": ("open connections per node", ["conns_mean", "conns_max"], True),
        "scale_join.png": ("a join: apply delay (s)", ["join_p50", "join_p95", "join_slowest"], False),
        "scale_model.png": (
            "a model announcement: apply delay (s)",
            ["model_p50", "model_p95", "model_slowest"],
            False,
        ),
    }
    styles = {"full_mesh": "-o", "partial_view": "--s"}
    written = []
    for name, (title, keys, logy) in groups.items():
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for mode in ("full_mesh", "partial_view"):
            rows = sorted((r for r in result["runs"] if r["mode"] == mode), key=lambda r: r["nodes"])
            if not rows:
                continue
            for key in keys:
                label, get = FIGURES[key]
                ax.plot(
                    [r["nodes"] for r in rows], [get(r) for r in rows], styles[mode], label=f"{mode}: {label}"
                )
        if name in targets:
            level, text = targets[name]
            ax.axhline(level, color="grey", linestyle=":", linewidth=1, label=text)
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("nodes (N)")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


KB = 1024

DESIGN = """## How the simulator works

`opentela/registry/sim/` is a discrete-event simulator: one heap of (time, sequence, callback) events, no
threads, no sockets, a run a pure function of its seed. What runs inside it is the registry's own code where the
code is pure: SWIM's `SwimState` (probe order, helpers, news and its precedence, piggybacking, suspicion,
due evictions), the partial view's `PartialView` (JOIN, FORWARD_JOIN, CONNECT, DISCONNECT, NEIGHBOR, REFUSE,
SHUFFLE), the fabric's `ConnectionLedger` (watermarks, grace, idle timeout, protection tags), `LocalHealth`,
and the CRDT's merge rule on record ranks. What the asyncio drivers do around them (`membership.py`,
`gossip.py`, `overlay.py`, the connection manager's sampling, the Host's dialing) is written again as events,
step for step, and reads the same `RegistryConfig` and `FabricConfig`.

- **Replicas.** 10,000 replicas of 10,000 records would be 10^8 entries; a replica is instead a map session ->
  rank (lifecycle << 32 | version, which orders as `(lifecycle, version)`), nodes present at the warm start
  sharing one base and keeping only their differences. A digest's hash is an incremental 64-bit fingerprint.
  `tests/unit/registry/sim/test_replica.py` checks it against `GMap` under random delivery orders.
- **SWIM members.** In a full mesh every node's member table holds every session; the tables share one
  roster and a node's `Member` is made when its SWIM state first looks it up. The real scans over all members
  (`due_evictions`, `suspected`, and with partial views `next_target` and `helpers`) run on the members they
  can return (the suspected ones, the neighbours' ones): same code, same answers.
- **Bytes.** Every message weighs what the real encoders produce (records signed with a real key, msgpack,
  the u32 length, 12-byte mux frames, the SYN's protocol name, FIN and the CANCEL reset the stream code sends,
  22 bytes of TLS 1.3 per record, the TLS and identity handshake of a new connection, keepalive PINGs on
  silent connections). The wire check below compares them with what real hosts write on loopback.
- **Time.** Per-pair one-way latency (the sum of two per-node halves: 5-50 ms at scale, 0.2-1 ms for the
  loopback validation), 1 Gbit/s out of each node, and processing at the receiver: each node's event loop is one
  server, a message costs a measured CPU time (a probe exchange's, from the wire check) plus a measured time per
  record (parse and signature check), a new connection the measured handshake work. In the validation every
  node's processing also shares the real machine's cores (all its processes shared two): nodes with work take
  turns on them, as the operating system shares cores between runnable processes, so a change that reaches
  many nodes at once waits for CPU as it did there without a node that has one message waiting behind a whole
  burst. A turn lasts as a process keeps its core: until it has nothing left to do or has used Linux's base
  time slice (0.75 ms x (1 + log2 cores), 1.5 ms on two), so a node that handles a record writes what it
  forwards in the same turn. Taking turns a message at a time instead put every forwarded message behind every
  other busy node's, which made a record that follows lazy push's tree (one path to each node) twice as slow
  as a flood's first copy, where the real processes show no such gap. Sending costs CPU too (fitted: a node's
  messages leave one after another, each once written; on loopback a write also runs the receiver's TCP
  stack), which the measured receive cost, taken from two warm hosts in one process, leaves out.
- **Scenarios.** A warm start (every replica complete; a full mesh is fully connected, as the Host never
  closes a connection; partial views are built by running the real join protocol offline through random
  earlier contacts, then topped up from the registry), an idle window, a join (a new node writes JOIN, then
  dials a bootstrap peer), a model announcement (a SERVING version bump), and churn (a random non-bootstrap
  node crashes without a word, a new one joins and serves two seconds later).

## What it leaves out

- TCP/IP headers and ACKs (the real benchmark counts bytes through the socket calls too), WINDOW_UPDATE
  frames (one per 128 KiB read), the few bytes a SWIM incarnation above 127 adds.
- Stalls of a node's own event loop (so Lifeguard's local health stays at 1 unless a node has to refute),
  rejoining after a false eviction (none happened: counted), the per-signer rate limit on held evictions,
  garbage collection of tombstones, record refreshes (one small push per node per hour).
- Two evictions of one session by different members have one rank; the real map keeps the one with the
  greater signed bytes (the simulator: the greater signer), and a replica that switches pushes it once more.
- The responder's digest is compared with the initiator's replica when it arrives, not when it was sent.
- A node with a dead peer's connection keeps it until the keepalive would have found it silent
  (`keepalive_interval + keepalive_timeout` after its last traffic): a crash without a goodbye, as a machine
  lost on a wide-area network looks. On one host, where the kernel resets the connection at once, detection is
  faster (docs/benchmarks/failure_detection.md).
"""


def acceptance(result: dict[str, Any]) -> list[str]:
    """The issue's targets, checked against this run (the largest N measured, and the churn runs)."""
    rows = []
    for mode in ("full_mesh", "partial_view"):
        runs = sorted((r for r in result["runs"] if r["mode"] == mode), key=lambda r: r["nodes"])
        if not runs:
            continue
        r = runs[-1]
        i, j = r["idle"], r["join"]
        worst = max(i["bytes_per_node_per_s"]["max"], i["bootstrap_bytes_per_s"]["max"])
        checks = [
            ("open connections per node (max) <= 64", i["connections"]["max"], i["connections"]["max"] <= 64),
            (
                "idle B/s per node, mean <= 2 KB/s",
                i["bytes_per_node_per_s"]["mean"],
                i["bytes_per_node_per_s"]["mean"] <= 2 * KB,
            ),
            ("idle B/s per node, max (bootstrap peers included) <= 2 KB/s", worst, worst <= 2 * KB),
            ("a join reaches 95 % of nodes within 2 s", j["t95_s"], j["t95_s"] <= 2.0),
            ("a join reaches every node within 5 s", j["t100_s"], j["t100_s"] <= 5.0),
        ]
        rows += [
            f"| {mode} | {r['nodes']} | {name} | {_fmt(v)} | {'met' if ok else 'NOT met'} |"
            for name, v, ok in checks
        ]
        for c in result.get("churn", []):
            if c["mode"] != mode:
                continue
            cr, t = c["crash_resolved"], c["traffic"]["bytes_per_node_per_s"]
            slowest = max(cr["slowest_s"], c["serve_resolved"]["slowest_s"])
            other = c["traffic"].get("other_bytes_per_s", {"max": math.nan})["max"]
            routed = max(
                c.get("crash_routing_resolved", {"slowest_s": math.nan})["slowest_s"],
                c["serve_resolved"]["slowest_s"],
            )
            # SWIM's detection bound is its time-bounded completeness: with partial views, a round robin over an
            # active view (a full mesh's, over every node, is far beyond the one-period figure, kept for it).
            bound = c.get("round_robin_bound_s") or c["bound_s"]
            rows += [
                f"| {mode} | {c['nodes']} (churn) | every view of SERVING replicas correct within "
                + (f"SWIM's detection bound, {bound} s" if bound != c["bound_s"] else f"{bound} s")
                + f" (slowest discrepancy: record LEFT, or SERVING applied) | {_fmt(slowest)} | "
                f"{'met' if slowest <= bound else 'NOT met'} |",
                f"| {mode} | {c['nodes']} (churn) | ... as routing sees it (a suspected replica is out of routing) | "
                f"{_fmt(routed)} | {'met' if routed <= bound else 'NOT met'} |",
            ]
            if bound != c["bound_s"]:
                rows.append(
                    f"| {mode} | {c['nodes']} (churn) | ... both within one probe period's figure, {c['bound_s']} s "
                    f"(a crashed node probed within a period) | {_fmt(slowest)} / {_fmt(routed)} | "
                    f"{'met' if max(slowest, routed) <= c['bound_s'] else 'NOT met'} |"
                )
            rows += [
                f"| {mode} | {c['nodes']} (churn) | no node's traffic over 10 KB/s (churn window) | {_fmt(t['max'])} | "
                f"{'met' if t['max'] <= 10 * KB else 'NOT met'} |",
                f"| {mode} | {c['nodes']} (churn) | ... bootstrap peers left out | {_fmt(other)} | "
                f"{'met' if other <= 10 * KB else 'NOT met'} |",
            ]
    if not rows:
        return []
    return [
        "## Against the targets",
        "",
        "| mode | N | target | measured | |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if math.isinf(v):
            return "never"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def render(result: dict[str, Any], pngs: list[str]) -> str:
    """Markdown summary (tables; docs/benchmarks/scale.md adds the reading below them)."""
    intro = (
        "Generated by `python benchmarks/scale.py` ("
        + ("quick" if result["quick"] else "full")
        + " run); raw numbers in `scale.json`. The simulator (`opentela/registry/sim/`) runs the real SWIM state"
        " machine, partial view, connection ledger and CRDT merge rule on a simulated clock; message sizes are"
        " measured from the real encoders. Scale runs: 5-50 ms one-way latency (per-node halves), 1 Gbit/s out"
        f" of each node, {result['bootstraps']} bootstrap peers, every node serving one model,"
        f" {result['idle_seconds']:.0f} s idle window."
    )
    if result.get("link_from"):
        intro += (
            f" The link's processing costs and the wire check are those measured by the run in"
            f" `{result['link_from']}` (`--link-from`), so the two runs differ only in the code."
        )
    lines = [
        "# The control plane at scale (simulated)",
        "",
        *textwrap.wrap(intro, 115),
        "",
        "| mode | N | idle B/s mean / p99 / max | bootstrap B/s max (share) | connections mean / max (bootstrap) "
        "| join p50 / p95 / slowest | model p50 / p95 / slowest | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["runs"], key=lambda r: (r["mode"], r["nodes"])):
        i, j, m = r["idle"], r["join"], r["serve_model"]
        b = i["bytes_per_node_per_s"]
        c = i["connections"]
        lines.append(
            f"| {r['mode']} | {r['nodes']} | {b['mean']:.0f} / {b['p99']:.0f} / {b['max']:.0f} | "
            f"{i['bootstrap_bytes_per_s']['max']:.0f} ({100 * i['bootstrap_share']:.2f} %) | "
            f"{c['mean']} / {c['max']} ({c['bootstrap_max']}) | "
            f"{_fmt(j['p50_s'])} / {_fmt(j['p95_s'])} / {_fmt(j['slowest_s'])} | "
            f"{_fmt(m['p50_s'])} / {_fmt(m['p95_s'])} / {_fmt(m['slowest_s'])} | {r['wall_s']:.0f} s |"
        )
    lines += [
        "",
        "Times in seconds from the originating write. Idle traffic: bytes sent + received per node.",
        "",
    ]
    lines += acceptance(result)
    lines += ["## Growth laws", "", "| figure | full_mesh | partial_view |", "|---|---|---|"]
    laws = result["growth"]
    for key, (label, _) in FIGURES.items():
        cells = []
        for mode in ("full_mesh", "partial_view"):
            fit = laws.get(mode, {}).get(key, {})
            cells.append(f"{fit.get('text', 'n/a')} (err {fit.get('rel_error', 'n/a')})" if fit else "n/a")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    lines.append("")
    for png in pngs:
        lines.append(f"![{png}]({png})")
    lines.append("")
    if result.get("churn"):
        lines += [
            "## Churn",
            "",
            "| mode | N | replaced | crash resolved p50 / p95 / slowest | crash out of routing p50 / p95 / slowest "
            "| serve resolved p50 / p95 / slowest | beyond bound | oldest open | false evictions "
            "| B/s mean / max (non-bootstrap max) | max 10 s bucket | connections mean / max | wall |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in result["churn"]:
            cr, sr, rr = c["crash_resolved"], c["serve_resolved"], c.get("crash_routing_resolved", {})
            t = c["traffic"]["bytes_per_node_per_s"]
            o = c["traffic"].get("other_bytes_per_s", {"max": math.nan})
            conns = c["traffic"]["connections"]
            lines.append(
                f"| {c['mode']} | {c['nodes']} | {c['replaced']} | {_fmt(cr['p50_s'])} / {_fmt(cr['p95_s'])} / "
                f"{_fmt(cr['slowest_s'])} | {_fmt(rr.get('p50_s'))} / {_fmt(rr.get('p95_s'))} / "
                f"{_fmt(rr.get('slowest_s'))} | {_fmt(sr['p50_s'])} / {_fmt(sr['p95_s'])} / {_fmt(sr['slowest_s'])} | "
                f"{c['beyond_bound']} of {c['pairs']} | {c['worst_open_age_s']} | {c['false_evictions']} | "
                f"{t['mean']:.0f} / {t['max']:.0f} ({o['max']:.0f}) | {c['max_bucket_bytes_per_s']:.0f} | "
                f"{conns['mean']} / {conns['max']} | {c['wall_s']:.0f} s |"
            )
        rr = result["churn"][-1].get("round_robin_bound_s")
        lines += [
            "",
            f"Detection bound: {result['churn'][0]['bound_s']} s, when a probe finds the crashed node within one "
            "period (with several probers, the expected case): the period, both probe timeouts and the suspicion "
            "grace."
            + (
                f" SWIM's own bound with partial views (its time-bounded completeness, Das et al. section 4.3): "
                f"{rr} s, each neighbour probing the crashed node within 2k - 1 of its periods, k its probe list "
                "(an active view)."
                if rr
                else ""
            ),
            "",
        ]
    if result.get("validation"):
        v = result["validation"]
        lines += [
            f"## Validation against real processes ({v.get('mode', 'full_mesh')}, loopback)",
            "",
            *([result["validation_note"] + ".", ""] if result.get("validation_note") else []),
            f"Real runs: `{v.get('reference', 'docs/benchmarks/convergence.json')}`.",
            "",
            (
                f"Receiving a message: {v['cpu_per_message_s'] * 1000:.2f} ms of one core (the wire check's "
                f"measurement); sending one, fitted: {v['cpu_per_send_s'] * 1000:.2f} ms; "
                if "cpu_per_send_s" in v
                else f"Per-message processing fitted: {v['cpu_per_message_s'] * 1000:.2f} ms of one core, "
            )
            + (
                f"the nodes taking turns on the real machine's {v['shared_cores']} cores."
                if v.get("shared_cores")
                else "stretched by the real run's load average over 2 cores."
            ),
            "",
            "| N | figure | simulated | real | ratio | within 20 % |",
            "|---|---|---|---|---|---|",
        ]
        for row in v["runs"]:
            for name, f in row["figures"].items():
                lines.append(
                    f"| {row['nodes']} | {name} | {_fmt(f['sim'])} | {_fmt(f['real'])} | {f['ratio']} | "
                    f"{'yes' if f['within_20pct'] else 'no'} |"
                )
        lines.append("")
    lines += [*DESIGN.splitlines(), ""]
    if result.get("wire_check"):
        lines += [
            "## Wire check (real hosts, loopback)",
            "",
            "| exchange | model bytes | real bytes | ratio |",
            "|---|---|---|---|",
        ]
        for name, e in result["wire_check"]["exchanges"].items():
            lines.append(f"| {name} | {e['model']} | {e['real']} | {e['ratio']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="128,1000,4000,10000")
    ap.add_argument("--modes", default="full_mesh,partial_view")
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--churn-nodes", type=int, default=1000)
    ap.add_argument("--churn-seconds", type=float, default=300.0)
    ap.add_argument("--validate", default="32,64,128", help="sizes of the loopback validation ('' to skip)")
    ap.add_argument(
        "--send-grid",
        default=",".join(f"{0.00005 * i:.5f}" for i in range(13)),  # 0 to 0.6 ms in steps of 0.05 ms
        help="seconds of CPU per message sent, tried in the validation (the best fit on the real runs is kept)",
    )
    ap.add_argument("--validate-trials", type=int, default=5, help="seeds per validation size (median taken)")
    ap.add_argument(
        "--validate-mode",
        default="partial_view",
        choices=["full_mesh", "partial_view"],
        help="the mode validated; the real runs must use the same code (full_mesh: the runs before partial views)",
    )
    ap.add_argument(
        "--validate-own-cores",
        action="store_true",
        help="each simulated node gets a core of its own, processing stretched by the real load average "
        "(the model before shared cores)",
    )
    ap.add_argument(
        "--validate-against",
        help="convergence.py JSON of real processes (default: convergence_partial_views.json for partial_view, "
        "convergence.json for full_mesh)",
    )
    ap.add_argument("--no-wire-check", action="store_true")
    ap.add_argument(
        "--link-from",
        help="a previous scale.json: reuse its measured link costs and wire check instead of measuring them "
        "(a rerun comparable with that run, and free of this machine's load at the moment)",
    )
    ap.add_argument("--quick", action="store_true", help="N up to 1,000, shorter windows (for tests)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--flood",
        action="store_true",
        help="partial views flood every record over every link (no lazy push), the behaviour before it",
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ap.add_argument(
        "--render-only", action="store_true", help="rewrite scale.md and the plots from scale.json"
    )
    args = ap.parse_args()
    if args.render_only:
        out = Path(args.out)
        result = json.loads((out / "scale.json").read_text())
        (out / "scale.md").write_text(render(result, plot(result, out)))
        return 0
    sizes_n = [int(x) for x in args.sizes.split(",") if x]
    churn_seconds = args.churn_seconds
    if args.quick:
        sizes_n = [n for n in sizes_n if n <= 1000] or [128]
        churn_seconds = min(churn_seconds, 120.0)
    modes = [m for m in args.modes.split(",") if m]
    wire = WireSizes.measure()
    previous = json.loads(Path(args.link_from).read_text()) if args.link_from else None
    if previous is not None:
        check = previous.get("wire_check")
    else:
        check = wire_check() if not args.no_wire_check else None
    per_message = check["cpu_per_message_s"] if check else 0.0005
    per_record = check["cpu_per_record_s"] if check else record_cost()
    per_dial = check["cpu_per_dial_s"] if check else 0.005
    link = dataclasses.replace(
        WAN, cpu_per_message=per_message, cpu_per_record=per_record, cpu_per_dial=per_dial
    )
    result: dict[str, Any] = {
        "benchmark": "scale",
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "bootstraps": 3,
        "lazy_push": not args.flood,
        "idle_seconds": args.idle_seconds,
        "wire": {
            "record_bytes": list(wire.record),
            "tls_overhead": wire.tls_overhead,
            "handshake_bytes": [wire.handshake_dialer, wire.handshake_listener],
        },
        "runs": [],
        "churn": [],
    }
    if check:
        result["wire_check"] = check
    if args.link_from:
        result["link_from"] = os.path.relpath(args.link_from, ROOT)
    result["link"] = dataclasses.asdict(link)
    result["registry"] = {
        mode: {
            k: v
            for k, v in dataclasses.asdict(registry_for(mode)).items()  # type: ignore[arg-type]
            if k
            in (
                "fanout",
                "anti_entropy_interval",
                "active_view",
                "passive_view",
                "shuffle_interval",
                "active_walk",
                "passive_walk",
                "passive_anti_entropy",
                "probe_interval",
                "probe_timeout",
                "indirect_timeout",
                "suspicion_timeout",
            )
        }
        for mode in modes
    }
    result["fabric"] = {
        k: v for k, v in dataclasses.asdict(FabricConfig()).items() if k.startswith(("conn_", "keepalive"))
    }
    if args.validate:
        print("validation...", file=sys.stderr)
        grid = sorted({float(x) for x in args.send_grid.split(",") if x})
        sizes_v = [int(x) for x in args.validate.split(",") if x]
        seeds = list(range(args.seed, args.seed + args.validate_trials))
        reference = Path(args.validate_against) if args.validate_against else None
        if reference is None:
            reference = CONVERGENCE_PARTIAL_VIEWS if args.validate_mode == "partial_view" else CONVERGENCE
        result["validation"] = validate(
            sizes_v,
            per_message,
            grid,
            per_record,
            per_dial,
            seeds,
            args.validate_mode,
            reference,
            not args.validate_own_cores,
        )
    for mode in modes:
        for n in sizes_n:
            print(f"{mode} N={n}...", file=sys.stderr)
            result["runs"].append(run_size(n, mode, wire, link, args.idle_seconds, args.seed, not args.flood))
    if args.churn_nodes:
        for mode in modes:
            result["churn"].append(
                run_churn(args.churn_nodes, mode, wire, link, churn_seconds, args.seed, not args.flood)
            )
    result["growth"] = growth(result["runs"])
    for r in result["runs"]:
        for key in ("join", "serve_model"):
            r[key]["delays"] = quantiles(r[key].get("delays", []))
    printable = json.loads(json.dumps(result, default=str))
    for r in printable["runs"]:
        for key in ("join", "serve_model"):
            r[key].pop("delays", None)
    print(json.dumps(printable, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    pngs = plot(result, out)
    (out / "scale.md").write_text(render(result, pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
