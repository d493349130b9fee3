"""Scenarios on a simulated mesh: warm start, an idle window, a join, a model announcement, churn.

Each returns a plain dict (JSON-ready) of what `benchmarks/scale.py` reports:
  - traffic: bytes sent + received per node per second over the window (mean, p50, p99, max), the bootstrap
    peers on their own and their share of all bytes, and the mean per node by category;
  - connections: open connections per node, sampled every second (mean over nodes and samples, and the most any
    node held at any sample), the bootstrap peers on their own;
  - convergence: seconds from the originating write (a joiner's JOIN record, before it has dialed anyone; a
    SERVING version bump) to each other live replica applying it (p50/p95/slowest; the time by which 95 % and
    100 % had it), and, for a join, the same counted from the first replica that applied it;
  - churn: every `60 / (rate * N)` seconds one random non-bootstrap node crashes (no LEFT; SWIM must find it) and
    a new node joins through a bootstrap peer and starts serving `serve_after` seconds later. Each change to the
    set of SERVING sessions (a serving node crashed, a new one serves) is a discrepancy at every live replica
    until that replica applies it; its age runs from the change (or from the replica's own join, if later).
    Traffic is counted over the churn; then the run goes on, without changes, for the detection bound and a
    little more, so the last changes have the time they are allowed.
    Reported: how long each took to resolve, the oldest still open at each one-second sample, and the bound
    they are held to, `probe_interval + probe_timeout + indirect_timeout + suspicion_timeout`; and, for a
    crash, how long until each replica's routing avoided it (suspected by its SWIM, or its node unreachable,
    or its record no longer SERVING), which is what a gateway's choice of replica depends on.
"""

from __future__ import annotations

import math
from typing import Any

from opentela._types import Lifecycle
from opentela.registry.sim.config import SimConfig
from opentela.registry.sim.mesh import Mesh, Watch
from opentela.registry.sim.metrics import per_node, percentile, spread
from opentela.registry.sim.network import CATEGORIES
from opentela.registry.sim.node import SimNode
from opentela.registry.sim.replica import rank_of
from opentela.registry.sim.wire import WireSizes


def build(config: SimConfig, sizes: WireSizes, settle: float = 5.0) -> Mesh:
    """A warm mesh of `config.nodes`, run for `settle` seconds so every timer has found its phase."""
    mesh = Mesh(config, sizes)
    mesh.warm_start()
    mesh.run(settle)
    return mesh


def detection_bound(mesh: Mesh) -> float:
    """From a crash to its eviction when a probe finds it within a period (with many probers, the expected
    case): a probe period, both timeouts and the suspicion grace."""
    c = mesh.registry_config
    return c.probe_interval + c.probe_timeout + c.indirect_timeout + c.suspicion_timeout


def round_robin_bound(mesh: Mesh) -> float | None:
    """SWIM's time-bounded completeness (Das et al., section 4.3) with partial views: each neighbour of a crashed
    node probes it within 2k - 1 of its periods, k its probe list (at most an active view), each period up to 1.1
    probe intervals with our jitter; then both timeouts and the suspicion grace. None for a full mesh (k = N)."""
    c = mesh.registry_config
    if not c.active_view:
        return None
    first_probe = (2 * c.active_view - 1) * 1.1 * c.probe_interval
    return round(first_probe + c.probe_timeout + c.indirect_timeout + c.suspicion_timeout, 2)


class _Window:
    """Byte counters and connection samples over a window, for the nodes alive at its start."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        net = mesh.net
        net.settle()
        self.start = mesh.loop.now
        self.nodes = [n.index for n in mesh.live_nodes()]
        self.sent0 = list(net.sent)
        self.recv0 = list(net.recv)
        self.cat0 = list(net.by_category)
        self.node_cat0 = {i: list(net.node_category[i]) for i in self.nodes}
        self.conn_sum = 0.0
        self.conn_samples = 0
        self.conn_max: dict[int, int] = {}

    def sample(self) -> None:
        net = self.mesh.net
        for i in self.nodes:
            if net.alive[i]:
                c = net.open_connections(i)
                self.conn_sum += c
                self.conn_samples += 1
                if c > self.conn_max.get(i, -1):
                    self.conn_max[i] = c

    def close(self) -> dict[str, Any]:
        mesh, net = self.mesh, self.mesh.net
        net.settle()
        seconds = mesh.loop.now - self.start
        alive = [i for i in self.nodes if net.alive[i]]
        rate = {i: (net.sent[i] - self.sent0[i] + net.recv[i] - self.recv0[i]) / seconds for i in alive}
        boots = [i for i in mesh.bootstraps if i in rate]
        total = sum(rate.values())
        per_cat = {
            name: round((net.by_category[k] - self.cat0[k]) * 2 / seconds / max(1, len(self.nodes)), 1)
            for k, name in enumerate(CATEGORIES)
        }
        busiest = {}
        for label, pool in (("max_node", list(rate)), ("max_other", [i for i in rate if i not in boots])):
            if pool:
                top = max(pool, key=lambda i: rate[i])
                busiest[label] = {
                    "node": top,
                    "bytes_per_s": round(rate[top], 1),
                    "by_category": {
                        name: round((net.node_category[top][k] - self.node_cat0[top][k]) / seconds, 1)
                        for k, name in enumerate(CATEGORIES)
                    },
                }
        conns = list(self.conn_max.values())
        boot_conns = [self.conn_max[i] for i in boots if i in self.conn_max]
        return {
            "seconds": round(seconds, 2),
            "nodes": len(alive),
            "bytes_per_node_per_s": per_node(list(rate.values())),
            "bootstrap_bytes_per_s": per_node([rate[i] for i in boots]),
            "other_bytes_per_s": per_node([r for i, r in rate.items() if i not in mesh.bootstraps]),
            "bootstrap_share": round(sum(rate[i] for i in boots) / total, 4) if total else 0.0,
            "by_category_per_node": per_cat,
            **busiest,
            "connections": {
                "mean": round(self.conn_sum / self.conn_samples, 1) if self.conn_samples else math.nan,
                "max": max(conns) if conns else 0,
                "bootstrap_max": max(boot_conns) if boot_conns else 0,
            },
        }


def idle(mesh: Mesh, seconds: float, sample_every: float = 1.0) -> dict[str, Any]:
    """Traffic and connections while nothing changes."""
    window = _Window(mesh)
    window.sample()
    mesh.run(seconds, sample_every, window.sample)
    return window.close()


def _until_all(mesh: Mesh, watch: Watch, nodes: list[int], timeout: float, step: float = 0.05) -> None:
    end = mesh.loop.now + timeout
    while mesh.loop.now < end:
        mesh.run(step)
        if all(i in watch.applied or not mesh.net.alive[i] for i in nodes):
            return


def _convergence(watch: Watch, nodes: list[int]) -> dict[str, Any]:
    delays = watch.delays(nodes)
    out: dict[str, Any] = spread(delays)
    out["t95_s"] = round(percentile(delays, 0.95), 4)
    out["t100_s"] = out["slowest_s"]
    out["delays"] = sorted(round(d, 5) for d in delays)
    return out


def join(mesh: Mesh, timeout: float = 30.0) -> dict[str, Any]:
    """A new node writes JOIN and dials a bootstrap peer; when does every replica have its record?"""
    live_boots = [b for b in mesh.bootstraps if mesh.net.alive[b]]
    contact = mesh.rng.choice(live_boots)
    others = [n.index for n in mesh.live_nodes()]
    start = mesh.loop.now
    node = mesh.add_node()
    watch = mesh.watch(node.session, rank_of(Lifecycle.JOIN, 1), start)
    mesh.overlay.join(node, contact)
    _until_all(mesh, watch, others, timeout)
    out = _convergence(watch, others)
    first = min(watch.delays(others))
    spread_from_first = spread([d - first for d in watch.delays(others)])
    out["from_first_replica"] = spread_from_first
    out["joiner_knows"] = mesh.replicas.known[node.index]
    out["contact"] = contact
    return out


def announce(mesh: Mesh, timeout: float = 30.0) -> dict[str, Any]:
    """A node starts serving a model (a SERVING version bump); when does every replica have it?"""
    candidates = [n for n in mesh.live_nodes() if n.index not in mesh.bootstraps]
    node = mesh.rng.choice(candidates)
    others = [n.index for n in mesh.live_nodes() if n is not node]
    start = mesh.loop.now
    rank = node.write(Lifecycle.SERVING)
    watch = mesh.watch(node.session, rank, start)
    _until_all(mesh, watch, others, timeout)
    return _convergence(watch, others)


class _Change:
    __slots__ = ("at", "done", "kind", "node", "watch")

    def __init__(self, kind: str, node: int, watch: Watch, at: float) -> None:
        self.kind, self.node, self.watch, self.at = kind, node, watch, at
        self.done = False


def churn(
    mesh: Mesh,
    seconds: float,
    rate: float = 0.01,
    serve_after: float = 2.0,
    sample_every: float = 1.0,
    bucket: float = 10.0,
) -> dict[str, Any]:
    """Replace `rate` of the nodes per minute (crash one, join a new one that then serves) for `seconds`."""
    bound = detection_bound(mesh)
    changes: list[_Change] = []
    routed: list[_Change] = []  # the same crashes, undone once a replica's routing avoids the session
    count = len(mesh.live_nodes())
    period = 60.0 / (rate * count)
    window = _Window(mesh)
    start = mesh.loop.now
    worst_open = 0.0
    open_samples: list[int] = []
    buckets: list[float] = []
    bucket_start = (start, list(mesh.net.sent), list(mesh.net.recv), [n.index for n in mesh.live_nodes()])
    replaced = 0
    joined: list[SimNode] = []

    def serve(node: SimNode) -> None:
        if node.alive:
            rank = node.write(Lifecycle.SERVING)
            changes.append(_Change("serve", node.index, mesh.watch(node.session, rank), mesh.loop.now))

    def replace() -> None:
        nonlocal replaced
        victims = [n for n in mesh.live_nodes() if n.index not in mesh.bootstraps]
        victim = mesh.rng.choice(victims)
        if victim.serving():
            gone = mesh.watch(victim.session, rank_of(Lifecycle.DOWN, 0))
            changes.append(_Change("crash", victim.index, gone, mesh.loop.now))
            routed.append(_Change("route", victim.index, mesh.watch_routing(victim.session), mesh.loop.now))
        mesh.kill(victim)
        newcomer = mesh.add_node()
        joined.append(newcomer)
        mesh.overlay.join(newcomer, mesh.rng.choice([b for b in mesh.bootstraps if mesh.net.alive[b]]))
        mesh.loop.call_later(serve_after, serve, newcomer)
        replaced += 1
        if mesh.loop.now + period < start + seconds:
            mesh.loop.call_later(period, replace)

    def sample() -> None:
        nonlocal worst_open, bucket_start
        window.sample()
        now = mesh.loop.now
        live = [n for n in mesh.live_nodes()]
        open_now = 0
        for change in changes:
            if change.done:
                continue  # every live replica had it at an earlier sample; later joiners copy it from one
            applied = change.watch.applied
            pending = 0
            for n in live:
                if n.index != change.node and n.index not in applied:
                    pending += 1
                    age = now - max(change.at, n.joined_at)
                    if age > 0:
                        open_now += 1
                        worst_open = max(worst_open, age)
            change.done = pending == 0
        open_samples.append(open_now)
        if now - bucket_start[0] >= bucket - 1e-9:
            t0, s0, r0, nodes = bucket_start
            mesh.net.settle()
            span = now - t0
            for i in nodes:
                if mesh.net.alive[i]:
                    buckets.append((mesh.net.sent[i] - s0[i] + mesh.net.recv[i] - r0[i]) / span)
            bucket_start = (now, list(mesh.net.sent), list(mesh.net.recv), [n.index for n in live])

    mesh.loop.call_later(period * mesh.rng.random(), replace)
    mesh.run(seconds, sample_every, sample)
    traffic = window.close()
    # No more changes; let the last ones resolve (or show that they do not) before judging.
    mesh.run(bound + 2 * serve_after + 5.0, sample_every, sample)
    resolved: dict[str, list[float]] = {"crash": [], "serve": [], "route": []}
    for change in changes + routed:
        for n in mesh.nodes:
            if n.index == change.node or not (n.alive or n.index in change.watch.applied):
                continue
            since = max(change.at, n.joined_at)
            got = change.watch.applied.get(n.index)
            if got is not None:
                resolved[change.kind].append(max(0.0, got - since))
            elif n.alive:
                resolved[change.kind].append(math.inf)
    false_evictions = sum(
        1
        for s, signers in mesh.evictions_of.items()
        if mesh.nodes[mesh.session_node[s]].alive and mesh.nodes[mesh.session_node[s]].session == s
    )
    all_delays = resolved["crash"] + resolved["serve"]
    return {
        "seconds": seconds,
        "rate_per_minute": rate,
        "replaced": replaced,
        "changes": {
            "crash": sum(c.kind == "crash" for c in changes),
            "serve": sum(c.kind == "serve" for c in changes),
        },
        "bound_s": bound,
        "round_robin_bound_s": round_robin_bound(mesh),
        "crash_resolved": spread(resolved["crash"], 3),
        "serve_resolved": spread(resolved["serve"], 3),
        "crash_routing_resolved": spread(resolved["route"], 3),
        "beyond_bound": sum(1 for d in all_delays if d > bound),
        "pairs": len(all_delays),
        "worst_open_age_s": round(worst_open, 3),
        "open_discrepancies_max": max(open_samples) if open_samples else 0,
        "false_evictions": false_evictions,
        "traffic": traffic,
        "bucket_s": bucket,
        "max_bucket_bytes_per_s": round(max(buckets), 1) if buckets else math.nan,
        "swim": _swim_totals(mesh),
    }


def _swim_totals(mesh: Mesh) -> dict[str, int]:
    totals: dict[str, int] = {}
    for node in mesh.nodes:
        for key, value in node.membership.counters.items():
            totals[key] = totals.get(key, 0) + value
    return totals
