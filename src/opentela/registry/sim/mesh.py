"""One simulated mesh: the clock, the network, every replica, every node, and what is true.

Names: node `i` is peer `"n<i>"`; session `s` is `"s<s>"` (a node that comes back gets a new session). Records are
(session, rank) pairs in the shared `ReplicaStore`; their sizes on the wire are the measured sizes of a signed
record in that lifecycle. `watch` records, for one change, when each replica first holds it (or something newer):
the convergence the benchmark reports, measured from the originating write as `benchmarks/convergence.py` does.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from opentela._types import Lifecycle, SessionId
from opentela.registry.sim.config import SimConfig
from opentela.registry.sim.events import EventLoop
from opentela.registry.sim.network import Network
from opentela.registry.sim.node import SimNode
from opentela.registry.sim.overlays import Overlay, overlay_for
from opentela.registry.sim.replica import ReplicaStore, lifecycle_of, rank_of
from opentela.registry.sim.wire import WireSizes


class Watch:
    """When each replica first held `session` at `min_rank` or later, counted from `start`."""

    __slots__ = ("applied", "min_rank", "session", "start")

    def __init__(self, session: int, min_rank: int, start: float) -> None:
        self.session = session
        self.min_rank = min_rank
        self.start = start
        self.applied: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"<Watch s{self.session} >= {self.min_rank:#x} applied at {len(self.applied)} replicas>"

    def delays(self, nodes: list[int]) -> list[float]:
        """Seconds from `start` to each of `nodes` applying it (inf where it never did)."""
        return [self.applied[n] - self.start if n in self.applied else float("inf") for n in nodes]


class Mesh:
    """The shared state of one simulation."""

    def __init__(self, config: SimConfig, sizes: WireSizes) -> None:
        self.config = config
        self.sizes = sizes
        self.registry_config = config.registry_config
        self.rng = random.Random(config.seed)
        self.loop = EventLoop()
        self.net = Network(
            self.loop,
            sizes,
            config.link,
            random.Random(self.rng.getrandbits(64)),
            keepalive_interval=config.fabric.keepalive_interval,
            keepalive_timeout=config.fabric.keepalive_timeout,
        )
        self.net.on_connected = self._connected
        self.net.on_disconnected = self._disconnected
        self.replicas = ReplicaStore([])
        self.replicas.listeners.append(self._applied)
        self.nodes: list[SimNode] = []
        self.peer_ids: list[str] = []
        self.node_index: dict[str, int] = {}
        self.session_ids: list[SessionId] = []
        self.session_index: dict[SessionId, int] = {}
        self.session_node: list[int] = []
        self.node_sessions: list[list[SessionId]] = []
        self.truth: list[int] = []
        """The rank each session's owner wrote last."""
        self.evictions_of: dict[int, set[int]] = {}
        self.origin: int | None = None
        """The peer whose records are being merged right now (None: a local write)."""
        self.watches: dict[int, list[Watch]] = {}
        self.route_watches: dict[int, Watch] = {}
        self.overlay: Overlay = overlay_for(self)
        self.bootstraps = list(range(config.bootstraps))

    def __repr__(self) -> str:
        alive = sum(1 for n in self.nodes if n.alive)
        return f"<Mesh {self.config.mode} nodes={alive}/{len(self.nodes)} t={self.loop.now:.2f}>"

    # --- names --------------------------------------------------------------------------------------------
    def _new_session(self, node: int) -> int:
        s = len(self.session_ids)
        sid = f"s{s}"
        self.session_ids.append(sid)
        self.session_index[sid] = s
        self.session_node.append(node)
        self.node_sessions[node].append(sid)
        self.truth.append(-1)
        return s

    def _new_node_slot(self) -> int:
        index = self.net.add_node()
        peer = f"n{index}"
        self.peer_ids.append(peer)
        self.node_index[peer] = index
        self.node_sessions.append([])
        return index

    def node_index_of_session(self, session_id: SessionId) -> int:
        """The node that owns a session."""
        return self.session_node[self.session_index[session_id]]

    def record_bytes(self, rank: int) -> int:
        """Bytes of the signed record at `rank` on the wire."""
        return self.sizes.record[lifecycle_of(rank)]

    # --- building ---------------------------------------------------------------------------------------------
    def warm_start(self) -> None:
        """`config.nodes` nodes that know one another: every replica holds every record, views are formed."""
        count = self.config.nodes
        serving = set(self.rng.sample(range(count), round(self.config.serving * count)))
        base = []
        for i in range(count):
            index = self._new_node_slot()
            s = self._new_session(index)
            rank = rank_of(Lifecycle.SERVING, 2) if i in serving else rank_of(Lifecycle.JOIN, 1)
            self.truth[s] = rank
            base.append(rank)
        self.replicas = ReplicaStore(base)
        self.replicas.listeners.append(self._applied)
        for index in range(count):
            self.replicas.add_replica(based=True)
            node = SimNode(self, index, index, self.overlay, random.Random(self.rng.getrandbits(64)))
            self.nodes.append(node)
        self.overlay.warm_start(count)
        for node in self.nodes:
            node.start()

    def add_node(self, *, lifecycle: Lifecycle = Lifecycle.JOIN) -> SimNode:
        """A new node with an empty replica, which writes its first record now (it has not dialed anyone)."""
        index = self._new_node_slot()
        s = self._new_session(index)
        self.replicas.add_replica(based=False)
        node = SimNode(self, index, s, self.overlay, random.Random(self.rng.getrandbits(64)))
        self.nodes.append(node)
        node.write(lifecycle)
        node.start()
        return node

    def kill(self, node: SimNode) -> None:
        """`node` crashes: no goodbye, no LEFT; the others find out through SWIM."""
        node.alive = False
        self.net.kill(node.index)

    def leave(self, node: SimNode) -> None:
        """`node` shuts down in order: it writes LEFT, pushes it to its flush targets, then goes."""
        node.write(Lifecycle.LEFT)
        targets = self.overlay.flush_targets(node)
        if targets:
            node.gossip.push(targets, [(node.session, node.rank(node.session), -1)])
        self.overlay.leave(node)
        node.alive = False
        self.net.kill(node.index)

    # --- what happened --------------------------------------------------------------------------------------
    def owner_wrote(self, session: int, rank: int) -> None:
        """An owner wrote `rank` for its own session."""
        self.truth[session] = rank

    def eviction_written(self, session: int, signer: int) -> None:
        """`signer` wrote an eviction of `session`."""
        self.evictions_of.setdefault(session, set()).add(signer)

    def watch(self, session: int, min_rank: int, start: float | None = None) -> Watch:
        """Start recording when each replica holds `session` at `min_rank` or later."""
        watch = Watch(session, min_rank, self.loop.now if start is None else start)
        self.watches.setdefault(session, []).append(watch)
        for node in self.nodes:
            if self.replicas.rank(node.index, session) >= min_rank:
                watch.applied[node.index] = self.loop.now
        return watch

    def watch_routing(self, session: int, start: float | None = None) -> Watch:
        """Like `watch(session, DOWN)`, but a replica also counts once its SWIM suspects the session or marks its
        node unreachable: from then on its routing avoids the session (`Membership.is_excluded`)."""
        watch = self.watch(session, rank_of(Lifecycle.DOWN, 0), start)
        self.route_watches[session] = watch
        return watch

    def routing_excludes(self, node: int, session_id: SessionId) -> None:
        """`node` stopped routing to `session_id` (suspected, or its node unreachable)."""
        if self.route_watches:
            watch = self.route_watches.get(self.session_index[session_id])
            if watch is not None and node not in watch.applied:
                watch.applied[node] = self.loop.now

    def _applied(self, node: int, session: int, old: int, new: int) -> None:
        watches = self.watches.get(session)
        if watches is not None:
            now = self.loop.now
            for watch in watches:
                if new >= watch.min_rank and node not in watch.applied:
                    watch.applied[node] = now
        self.nodes[node].on_apply(session, old, new)

    def _connected(self, node: int, peer: int) -> None:
        self.nodes[node].connected(peer)

    def _disconnected(self, node: int, peer: int) -> None:
        if self.nodes[node].alive:
            self.nodes[node].disconnected(peer)

    # --- running ------------------------------------------------------------------------------------------
    def run(self, seconds: float, every: float = 0.0, sample: Callable[[], None] | None = None) -> None:
        """Advance simulated time by `seconds`, calling `sample()` every `every` seconds if given."""
        end = self.loop.now + seconds
        if sample is None or every <= 0:
            self.loop.run_until(end)
            return
        t = self.loop.now
        while t < end - 1e-9:
            t = min(end, t + every)
            self.loop.run_until(t)
            sample()

    def live_nodes(self) -> list[SimNode]:
        """Nodes that are up."""
        return [n for n in self.nodes if n.alive]
