"""Links between simulated nodes: latency, egress bandwidth, per-node processing, connections and their bytes.

A message is a callback delivered to another node after its sender's egress queue drains it (`bytes /
bandwidth`), one-way latency, and the receiver's processing (a single server per node: the node's event loop,
`cpu` seconds a message, stretched by `slowdown` when many simulated processes share a few real cores). Latency is
per pair and stable: each node draws half a one-way delay, a pair's delay is the sum of the two halves.

Connections are explicit, as the Host keeps them: a message to a peer with no connection first dials it (TLS and
identity handshake: their bytes, and 4 round trips before the dialer may send, 3.5 before the listener sees the
connection), and both ends hear `connected`. Every byte is counted at both ends, sent and received, by category.
Keepalive is counted without events: a connection silent for `keepalive_interval` exchanges
`KEEPALIVE_PINGS` PINGs and their answers per interval; the pings owed are settled whenever the connection
carries traffic or is read.

A full mesh warm start at 10,000 nodes would need 5 * 10^7 connection objects. There the pairs no message has
touched yet stay implicit: a per-node count of connections, each paying the keepalive of a silent connection
(its integral over time is kept exactly), until a message touches the pair and makes it explicit.

A node that dies sends nothing more and receives nothing; its peers keep their connections until their
keepalive would have found it silent (`keepalive_interval + keepalive_timeout` after its last traffic), then
drop them and call `disconnected`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentela.registry.sim.events import EventLoop
from opentela.registry.sim.wire import WireSizes

HANDSHAKE_LEGS_DIALER = (
    8  # TCP, TLS 1.3 and the identity handshake: one-way trips until the dialer is connected
)
HANDSHAKE_LEGS_LISTENER = 7
KEEPALIVE_PINGS = 2
"""PINGs per keepalive interval on a silent connection, each answered. Each end's timer runs from its own last
receive, and with keepalive_timeout below keepalive_interval both fire within a round trip of each other, so
both ends ping (measured on loopback: 168 bytes per interval; a race either way on a slower link)."""

CATEGORIES = ("probe", "push", "anti_entropy", "keepalive", "handshake", "overlay", "close", "lazy")
PROBE, PUSH, ANTI_ENTROPY, KEEPALIVE, HANDSHAKE, OVERLAY, CLOSE, LAZY = range(len(CATEGORIES))
"""LAZY: lazy push's ids, prunes and grafts (the records a graft brings included)."""


@dataclass(frozen=True)
class LinkModel:
    """How messages travel: latency range, bandwidth and the receiver's processing cost."""

    latency: tuple[float, float] = (0.005, 0.05)
    """Range of one-way delays in seconds (a pair's delay is the sum of two per-node halves)."""
    bandwidth: float = 125e6
    """Egress bytes per second of each node (0: unlimited)."""
    cpu_per_message: float = 0.0
    """Seconds a node's event loop spends on one received message."""
    cpu_per_record: float = 0.0
    """Extra seconds per record received (signature check and merge)."""
    cpu_per_dial: float = 0.0
    """Seconds of handshake work (TLS and identity) a new connection costs, before either side may use it."""
    cpu_per_send: float = 0.0
    """Seconds the sender's event loop spends writing one message (encoding, encryption, the write: on loopback
    the write also runs the receiver's TCP stack): a node's messages leave one after another, each once written."""
    slowdown: float = 1.0
    """Multiplier on processing: how many simulated processes share one real core."""
    cores: int = 0
    """Real cores that every node's processing shares (0: each node has its own). One machine running all the
    nodes as processes, as the real-process benchmark does: nodes with work take turns on these cores, as an
    operating system shares cores between runnable processes, so a burst that reaches many nodes at once queues
    as it does on that machine."""
    cpu_slice: float = 0.0
    """With shared cores: seconds of work a node may do in one turn once it has a core (a time slice: a process
    keeps its core until it blocks or its slice is used up); 0: one message read or written a turn."""


class Conn:
    """One connection between two nodes, shared by both ends' tables."""

    __slots__ = ("a", "b", "closed", "implicit", "pings", "quiet_since", "ready_at")

    def __init__(self, a: int, b: int, ready_at: float, quiet_since: float, implicit: bool = False) -> None:
        self.a, self.b = a, b
        self.ready_at = ready_at
        self.quiet_since = quiet_since
        self.pings = 0
        self.closed = False
        self.implicit = implicit

    def __repr__(self) -> str:
        return f"<Conn {self.a}<->{self.b} quiet since {self.quiet_since:.2f}>"


ConnectListener = Callable[[int, int], None]
"""Called with (node, peer) when a connection comes up at `node` or goes away there."""


class Network:
    """Every simulated node's links, byte counters and connections."""

    def __init__(
        self,
        loop: EventLoop,
        sizes: WireSizes,
        model: LinkModel,
        rng: random.Random,
        *,
        keepalive_interval: float,
        keepalive_timeout: float,
    ) -> None:
        self.loop = loop
        self.sizes = sizes
        self.model = model
        self.rng = rng
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        self._inv_bw = 1.0 / model.bandwidth if model.bandwidth > 0 else 0.0
        self._cpu = model.cpu_per_message * model.slowdown
        self._cpu_record = model.cpu_per_record * model.slowdown
        self._cpu_send = model.cpu_per_send * model.slowdown
        self.sent: list[float] = []
        self.recv: list[float] = []
        self.alive: list[bool] = []
        self.conns: list[dict[int, Conn]] = []
        self.implicit: list[int] = []
        """Implicit connections per node (full-mesh warm start)."""
        self._implicit_peers = 0
        """Nodes [0, this) are implicitly connected to each other until a pair is touched."""
        self._fluid_at: list[float] = []
        self._half: list[float] = []
        self._nic_free: list[float] = []
        self._cpu_free: list[float] = []
        self._shared = model.cores > 0
        self._idle_cores = model.cores
        self._runnable: deque[int] = deque()
        """Nodes with work waiting, in the order they get a shared core (one piece of work at a time)."""
        self._work: list[deque[tuple[float, Callable[..., None], tuple[Any, ...]]]] = []
        self._scheduled: list[bool] = []
        """Whether a node is runnable or running on a shared core."""
        self.by_category = [0.0] * len(CATEGORIES)
        self.node_category: list[list[float]] = []
        """Bytes each node sent and received, by category (keepalive of implicit connections left out)."""
        self.on_connected: ConnectListener | None = None
        self.on_disconnected: ConnectListener | None = None
        self.dials = 0
        self.messages = 0
        self._dropped_implicit: dict[int, set[int]] = {}
        self.activity: list[set[int]] | None = None
        """When set, each node's peers that carried a stream since the set was last cleared."""

    def __repr__(self) -> str:
        return f"<Network nodes={len(self.alive)} messages={self.messages} dials={self.dials}>"

    # --- nodes --------------------------------------------------------------------------------------------
    def add_node(self) -> int:
        """A new node with no connections; returns its index."""
        lo, hi = self.model.latency
        self.sent.append(0.0)
        self.recv.append(0.0)
        self.node_category.append([0.0] * len(CATEGORIES))
        self.alive.append(True)
        self.conns.append({})
        self.implicit.append(0)
        self._fluid_at.append(self.loop.now)
        self._half.append(self.rng.uniform(lo / 2, hi / 2))
        self._nic_free.append(0.0)
        self._cpu_free.append(0.0)
        self._work.append(deque())
        self._scheduled.append(False)
        if self.activity is not None:
            self.activity.append(set())
        return len(self.alive) - 1

    def full_mesh(self, count: int) -> None:
        """Nodes [0, count) start connected to one another (implicitly: see the module docstring)."""
        self._implicit_peers = count
        now = self.loop.now
        for i in range(count):
            self.implicit[i] = count - 1
            self._fluid_at[i] = now

    def latency(self, a: int, b: int) -> float:
        """One-way delay between two nodes."""
        return self._half[a] + self._half[b]

    def open_connections(self, node: int) -> int:
        """Connections `node` holds now."""
        return len(self.conns[node]) + self.implicit[node]

    # --- bytes --------------------------------------------------------------------------------------------
    def count(self, src: int, dst: int, nbytes: float, category: int) -> None:
        """Book `nbytes` sent by `src` and received by `dst` (when it is alive)."""
        self.sent[src] += nbytes
        self.node_category[src][category] += nbytes
        if self.alive[dst]:
            self.recv[dst] += nbytes
            self.node_category[dst][category] += nbytes
        self.by_category[category] += nbytes

    def _fluid(self, node: int, now: float) -> None:
        degree = self.implicit[node]
        if degree:
            pings = KEEPALIVE_PINGS * degree * (now - self._fluid_at[node]) / self.keepalive_interval
            nbytes = pings * self.sizes.keepalive
            self.sent[node] += nbytes
            self.recv[node] += nbytes
            self.by_category[KEEPALIVE] += nbytes
        self._fluid_at[node] = now

    def _settle(self, conn: Conn, now: float) -> None:
        owed = int((now - conn.quiet_since) / self.keepalive_interval) - conn.pings
        if owed > 0:
            conn.pings += owed
            nbytes = KEEPALIVE_PINGS * owed * self.sizes.keepalive
            for end in (conn.a, conn.b):
                self.sent[end] += nbytes
                self.recv[end] += nbytes
                self.node_category[end][KEEPALIVE] += 2 * nbytes
            self.by_category[KEEPALIVE] += 2 * nbytes

    def settle(self) -> None:
        """Book every keepalive owed up to now (before reading the counters)."""
        now = self.loop.now
        for node, table in enumerate(self.conns):
            if self.alive[node]:
                self._fluid(node, now)
                for peer, conn in table.items():
                    if peer > node or not self.alive[peer]:
                        self._settle(conn, now)

    # --- connections --------------------------------------------------------------------------------------
    def connection(self, a: int, b: int) -> Conn | None:
        """The connection between two nodes, made explicit if it was implicit; None when there is none."""
        conn = self.conns[a].get(b)
        if conn is not None or not (a < self._implicit_peers and b < self._implicit_peers):
            return conn
        if not self.implicit[a] or not self.implicit[b] or b in self._gone_implicit(a):
            return None
        if not (self.alive[a] and self.alive[b]):
            return None  # a dead peer's silent connection: what is sent into it is lost, and not counted
        now = self.loop.now
        self._fluid(a, now)
        self._fluid(b, now)
        self.implicit[a] -= 1
        self.implicit[b] -= 1
        # Its keepalive so far was paid by the fluid count; its phase within an interval is unknown.
        conn = Conn(a, b, now, now - self.rng.uniform(0.0, self.keepalive_interval), implicit=True)
        self.conns[a][b] = self.conns[b][a] = conn
        return conn

    def _gone_implicit(self, node: int) -> set[int]:
        return self._dropped_implicit.get(node, _EMPTY)

    def is_connected(self, a: int, b: int) -> bool:
        """Whether `a` holds a connection to `b` (explicit, or an untouched pair of the warm full mesh)."""
        if b in self.conns[a]:
            return True
        return (
            a != b
            and a < self._implicit_peers
            and b < self._implicit_peers
            and self.implicit[a] > 0
            and b not in self._gone_implicit(a)
            and self.alive[a]
        )

    def warm_connection(self, a: int, b: int) -> None:
        """An established connection at the warm start: no handshake counted, no `connected` callbacks."""
        if b in self.conns[a]:
            return
        now = self.loop.now
        conn = Conn(a, b, now, now - self.rng.uniform(0.0, self.keepalive_interval))
        self.conns[a][b] = self.conns[b][a] = conn

    def connect(self, src: int, dst: int) -> Conn | None:
        """The connection from `src` to `dst`, dialing it when there is none (None when `dst` is dead)."""
        conn = self.connection(src, dst)
        if conn is not None:
            return conn
        if not self.alive[dst]:
            return None
        now = self.loop.now
        leg = self.latency(src, dst)
        work = self.model.cpu_per_dial * self.model.slowdown
        conn = Conn(src, dst, now + HANDSHAKE_LEGS_DIALER * leg + work, now)
        self.conns[src][dst] = self.conns[dst][src] = conn
        self.dials += 1
        self.count(src, dst, self.sizes.handshake_dialer, HANDSHAKE)
        self.count(dst, src, self.sizes.handshake_listener, HANDSHAKE)
        self.loop.call_at(conn.ready_at, self._up, src, dst, conn)
        self.loop.call_at(now + HANDSHAKE_LEGS_LISTENER * leg + work, self._up, dst, src, conn)
        return conn

    def _up(self, node: int, peer: int, conn: Conn) -> None:
        if not conn.closed and self.alive[node] and self.on_connected is not None:
            self.on_connected(node, peer)

    def close(self, node: int, peer: int) -> None:
        """`node` closes its connection to `peer` (GOAWAY each way, then the sockets close)."""
        conn = self.conns[node].get(peer)
        if conn is None:
            return
        self._settle(conn, self.loop.now)
        self.count(node, peer, self.sizes.flight(self.sizes.goaway), CLOSE)
        if self.alive[peer]:
            self.count(peer, node, self.sizes.flight(self.sizes.goaway), CLOSE)
        self._drop(conn)
        if self.on_disconnected is not None:
            self.on_disconnected(node, peer)
            if self.alive[peer]:
                self.loop.call_later(self.latency(node, peer), self._notify_gone, peer, node)

    def _notify_gone(self, node: int, peer: int) -> None:
        if self.alive[node] and peer not in self.conns[node] and self.on_disconnected is not None:
            self.on_disconnected(node, peer)

    def _drop(self, conn: Conn) -> None:
        conn.closed = True
        if self.conns[conn.a].get(conn.b) is conn:
            del self.conns[conn.a][conn.b]
        if self.conns[conn.b].get(conn.a) is conn:
            del self.conns[conn.b][conn.a]

    def kill(self, node: int) -> None:
        """`node` dies silently: its peers find out by keepalive, unless traffic shows them first."""
        now = self.loop.now
        self._fluid(node, now)
        self.alive[node] = False
        for peer, conn in list(self.conns[node].items()):
            self._settle(conn, now)
            found = max(now, conn.quiet_since + self.keepalive_interval) + self.keepalive_timeout
            self.loop.call_at(found, self._keepalive_failed, peer, node, conn)
        if node < self._implicit_peers and self.implicit[node]:
            # Every implicit pair with the dead node goes at once: their keepalive phases are spread evenly,
            # so this is early by half an interval on average and the count is exact by then.
            delay = self.keepalive_interval + self.keepalive_timeout
            self.loop.call_later(delay, self._implicit_failed, node)

    def _keepalive_failed(self, node: int, dead: int, conn: Conn) -> None:
        if conn.closed:
            return
        self.count(node, dead, self.sizes.keepalive, KEEPALIVE)
        self._drop(conn)
        if self.alive[node] and self.on_disconnected is not None:
            self.on_disconnected(node, dead)

    def _implicit_failed(self, dead: int) -> None:
        now = self.loop.now
        dropped = self._dropped_implicit
        for node in range(self._implicit_peers):
            if node != dead and dead not in self.conns[node] and dead not in dropped.get(node, _EMPTY):
                if self.implicit[node]:
                    self._fluid(node, now)
                    self.implicit[node] -= 1
                dropped.setdefault(node, set()).add(dead)
                if self.alive[node] and self.on_disconnected is not None:
                    self.on_disconnected(node, dead)
        self.implicit[dead] = 0

    # --- messages -----------------------------------------------------------------------------------------
    def send(
        self,
        src: int,
        dst: int,
        nbytes: int,
        category: int,
        handler: Callable[..., None] | None,
        *args: Any,
        records: int = 0,
    ) -> bool:
        """Send a flight of `nbytes` from `src` to `dst`; `handler(*args)` runs at `dst` when it is processed.

        False when there is no way to send (the destination is dead and not connected): nothing is counted.
        """
        conn = self.connect(src, dst)
        if conn is None:
            return False
        self.messages += 1
        self._settle(conn, self.loop.now)
        self.count(src, dst, nbytes, category)
        if self.activity is not None:
            self.activity[src].add(dst)
            self.activity[dst].add(src)
        if self._shared and self._cpu_send:
            # Writing it is work of the sender's loop, done in its turn on a shared core; then it leaves.
            self._enqueue(
                src, self._cpu_send, self._transmit, (src, dst, conn, nbytes, handler, args, records)
            )
        else:
            self._transmit(src, dst, conn, nbytes, handler, args, records)
        return True

    def _transmit(
        self,
        src: int,
        dst: int,
        conn: Conn,
        nbytes: int,
        handler: Callable[..., None] | None,
        args: tuple[Any, ...],
        records: int,
    ) -> None:
        now = self.loop.now
        start = now if conn.ready_at <= now else conn.ready_at
        if self._nic_free[src] > start:
            start = self._nic_free[src]  # still transmitting, or still processing what made this message
        if self._cpu_send and not self._shared:
            start = self._occupy(src, start, self._cpu_send) + self._cpu_send
            self._nic_free[src] = start
        if self._inv_bw:
            start += nbytes * self._inv_bw
            self._nic_free[src] = start
        arrive = start + self._half[src] + self._half[dst]
        conn.quiet_since = arrive
        conn.pings = 0
        if handler is not None and self.alive[dst]:
            self.loop.call_at(arrive, self._deliver, dst, conn, handler, args, records)

    def _deliver(
        self, dst: int, conn: Conn, handler: Callable[..., None], args: tuple[Any, ...], records: int
    ) -> None:
        if not self.alive[dst] or conn.closed:
            return
        cost = self._cpu + records * self._cpu_record
        if cost <= 0.0:
            handler(*args)
            return
        if self._shared:
            self._enqueue(dst, cost, self._run, (dst, handler, args))
            return
        now = self.loop.now
        start = self._occupy(dst, now, cost)
        done = start + cost
        if start <= now:
            # Handled now, and what the handler sends is held until the work is done (its replica changes `cost`
            # early, which no one can observe before its next message leaves).
            if self._nic_free[dst] < done:
                self._nic_free[dst] = done
            handler(*args)
            return
        self.loop.call_at(done, self._run, dst, handler, args)

    def _occupy(self, node: int, at: float, cost: float) -> float:
        """`node`, on a core of its own, does `cost` seconds of work from `at`, after what its event loop already
        holds; returns when the work starts."""
        start = self._cpu_free[node]
        if start < at:
            start = at
        self._cpu_free[node] = start + cost
        return start

    # --- shared cores: every node's processing on the machine's few cores ---------------------------------------
    # The operating system shares cores between runnable processes fairly, so a process with one message waiting
    # does not wait for the whole backlog of a burst, as it would in one queue of all messages: runnable nodes
    # take turns, and a node is on one core at most. A turn lasts until the node has nothing left to do or has
    # used its slice (at least one piece: a message read or written).
    def _enqueue(self, node: int, cost: float, then: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._work[node].append((cost, then, args))
        if not self._scheduled[node]:
            self._scheduled[node] = True
            self._runnable.append(node)
            self._dispatch()

    def _dispatch(self) -> None:
        while self._idle_cores and self._runnable:
            node = self._runnable.popleft()
            if not self.alive[node]:
                self._work[node].clear()
                self._scheduled[node] = False
                continue
            cost, then, args = self._work[node].popleft()
            self._idle_cores -= 1
            self.loop.call_later(cost, self._finish, node, then, args, cost)

    def _finish(self, node: int, then: Callable[..., None], args: tuple[Any, ...], used: float) -> None:
        if self.alive[node]:
            then(*args)
            if self._work[node] and used < self.model.cpu_slice:
                # Still within its slice: it goes on with its next piece (what the one just done queued, such as
                # the messages a handler sends, included) without giving up the core.
                cost, then, args = self._work[node].popleft()
                self.loop.call_later(cost, self._finish, node, then, args, used + cost)
                return
        self._idle_cores += 1
        if self._work[node]:
            self._runnable.append(node)  # its next piece waits for the others' turns
        else:
            self._scheduled[node] = False
        self._dispatch()

    def _run(self, dst: int, handler: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.alive[dst]:
            handler(*args)


_EMPTY: set[int] = set()
