"""Partial views over the simulated network: the real `PartialView` and `ConnectionLedger`, driven as the
fabric drives them (`registry/overlay.py`, `fabric/connection_manager.py`).

Each node holds a `PartialView` (active view `active_view`, passive `passive_view`) and a `ConnectionLedger`
with the fabric's watermarks, grace and idle timeout. Overlay messages go one batch per peer at a time, the next
once the previous is acknowledged, as `Overlay._deliver` sends them; a batch unanswered within
`gossip_timeout` fails the peer. The view is topped up from the replica (a live member in neither view, not
suspected) and forgets a peer when its last live session ends. Active peers are protected in the ledger (tag
"view"). SWIM's members are still every live session of the replica, but a node probes (and asks for help)
only its neighbours' sessions; changes are flooded to unsuspected neighbours, each record kept from the peer it
came from; anti-entropy runs with a neighbour or, `passive_anti_entropy` of the time, with a passive peer; the
"hello" exchange runs when a neighbour comes up and this node has not synced within an interval; and only a
neighbour's lost connection (or an overlay message that went unanswered) makes SWIM probe a peer at once, and
watch it while it is unreachable. A joiner protects its bootstrap peer's connection (tag "bootstrap") until it has
a neighbour, as the node agent does. Every `TRIM_INTERVAL` each node samples which connections carried a stream
and lets its ledger choose what to close (GOAWAY).

The warm start runs the real join protocol offline (every node joins through a random earlier one, messages
delivered in order with no time passing and no bytes counted), then tops every passive view up from the
registry, so the run starts from views the protocol itself built.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentela._types import PeerId
from opentela.fabric.connection_manager import BOOTSTRAP, TRIM_INTERVAL, ConnectionLedger
from opentela.registry.partial_view import PartialView, Send, ViewMessage
from opentela.registry.sim.network import OVERLAY
from opentela.registry.sim.overlays import FullMeshOverlay, follow_members, live, shared_roster
from opentela.registry.sim.wire import view_batch, view_message

if TYPE_CHECKING:
    from opentela.registry.sim.mesh import Mesh
    from opentela.registry.sim.node import SimNode

PROTECT_TAG = "view"  # registry/overlay.py's tag
MAX_BATCH = 64


class ViewState:
    """One node's overlay state: its views, its connection ledger and what it has queued for each peer."""

    __slots__ = ("activity", "ledger", "neighbours", "outbox", "sending", "view")

    def __init__(self, view: PartialView, ledger: ConnectionLedger) -> None:
        self.view = view
        self.ledger = ledger
        self.outbox: dict[int, list[ViewMessage]] = {}
        self.sending: dict[int, int] = {}  # peer -> serial of the batch in flight
        self.activity: set[int] = set()
        self.neighbours: list[int] | None = None  # the active view as node indices, until it changes

    def __repr__(self) -> str:
        return f"<ViewState {self.view!r} {self.ledger!r}>"


class ViewOverlay:
    """Partial views, flooding over the active view, and the connection limits."""

    floods = True

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.config = mesh.registry_config
        self.fabric = mesh.config.fabric
        self.fanout = self.config.fanout
        self._serial = 0
        self._live_peers = FullMeshOverlay(mesh)  # for a node with no neighbour: random live peers
        mesh.net.activity = [set() for _ in range(len(mesh.net.alive))]

    def __repr__(self) -> str:
        return f"<ViewOverlay active={self.config.active_view} passive={self.config.passive_view}>"

    def state(self, node: SimNode) -> ViewState:
        """The node's overlay state, made on first use."""
        state = node.view_state
        if state is None:
            clock: Callable[[], float] = lambda: self.mesh.loop.now  # noqa: E731
            view = PartialView(
                node.peer_id,
                active_max=max(2, self.config.active_view),
                passive_max=self.config.passive_view,
                active_walk=self.config.active_walk,
                passive_walk=self.config.passive_walk,
                rng=node.rng,
            )
            fabric = self.fabric
            ledger = ConnectionLedger(
                fabric.conn_low_water,
                fabric.conn_high_water,
                grace=fabric.conn_grace,
                idle_timeout=fabric.conn_idle_timeout,
                clock=clock,
            )
            state = node.view_state = ViewState(view, ledger)
            self._start(node)
        assert isinstance(state, ViewState)
        return state

    def _start(self, node: SimNode) -> None:
        rng = node.rng
        loop = self.mesh.loop
        loop.call_later(self.config.shuffle_interval * rng.random(), self._tick, node)
        loop.call_later(TRIM_INTERVAL * rng.random(), self._trim, node)

    # --- warm start ---------------------------------------------------------------------------------------
    def warm_start(self, count: int) -> None:
        mesh = self.mesh
        nodes = mesh.nodes[:count]
        queue: collections.deque[tuple[int, int, ViewMessage]] = collections.deque()

        def run(node: SimNode, step: Callable[..., list[Send]], *args: Any) -> None:
            for peer, msg in step(*args):
                queue.append((node.index, mesh.node_index[peer], msg))

        for i, node in enumerate(nodes):
            view = self.state(node).view
            if i:
                run(node, view.join, mesh.peer_ids[mesh.rng.randrange(i)])
            while queue:
                src, dst, msg = queue.popleft()
                run(mesh.nodes[dst], self.state(mesh.nodes[dst]).view.receive, mesh.peer_ids[src], msg)
        for node in nodes:
            state = self.state(node)
            room = self.config.passive_view - len(state.view.passive)
            if room > 0:
                run(node, state.view.offer, self._sample_known(node, room))
        while queue:  # repairs the offers asked for: deliver them too
            src, dst, msg = queue.popleft()
            run(mesh.nodes[dst], self.state(mesh.nodes[dst]).view.receive, mesh.peer_ids[src], msg)
        shared_roster(mesh, count)
        net = mesh.net
        now = mesh.loop.now
        for node in nodes:
            state = self.state(node)
            lazy = node.gossip.lazy
            for peer_id in state.view.active:
                net.warm_connection(node.index, mesh.node_index[peer_id])
                state.ledger.opened(peer_id, now - self.fabric.conn_grace)
                state.ledger.protect(peer_id, PROTECT_TAG)
                if lazy is not None:  # nodes that ran together know each other understand ids
                    lazy.neighbour_up(mesh.node_index[peer_id])
                    lazy.learned(mesh.node_index[peer_id])

    # --- driving the view ---------------------------------------------------------------------------------
    def _apply(self, node: SimNode, step: Callable[..., list[Send]], *args: Any) -> None:
        state = self.state(node)
        view = state.view
        before = view.active
        sends = step(*args)
        if not view.passive and len(view.active) < view.active_max:
            sends += view.offer(self._sample_known(node, self.config.passive_view))
        after = view.active
        if before != after:
            state.neighbours = None
            was, now = set(before), set(after)
            for peer_id in now - was:
                state.ledger.protect(peer_id, PROTECT_TAG)
                self._neighbour_up(node, self.mesh.node_index[peer_id])
            for peer_id in was - now:
                state.ledger.unprotect(peer_id, PROTECT_TAG)
                node.gossip.neighbour_down(self.mesh.node_index[peer_id])
        for peer_id, msg in sends:
            self._enqueue(node, self.mesh.node_index[peer_id], msg)

    def _neighbour_up(self, node: SimNode, peer: int) -> None:
        """Gossip's hello: a joiner pulls its first sync in parts; only another node that never synced asks."""
        if not node.gossip.neighbour_up(peer) and not node.gossip.synced:
            node.gossip.exchange(peer)

    def _peer_failed(self, node: SimNode, peer: int) -> None:
        state = self.state(node)
        peer_id = self.mesh.peer_ids[peer]
        was_active = state.view.is_active(peer_id)
        self._apply(node, state.view.failed, peer_id)
        if was_active:
            node.membership.suspect(peer)

    def _tick(self, node: SimNode) -> None:
        if not node.alive:
            return
        self.mesh.loop.call_later(self.config.shuffle_interval * (0.5 + node.rng.random()), self._tick, node)
        view = self.state(node).view
        room = self.config.passive_view - len(view.passive)
        if room > 0:
            self._apply(node, view.offer, self._sample_known(node, room))
        self._apply(node, view.tick)

    def _sample_known(self, node: SimNode, k: int) -> list[PeerId]:
        """Up to `k` random live members of the replica in neither view, not suspected."""
        mesh = self.mesh
        view = self.state(node).view
        sessions = mesh.session_node
        n = len(sessions)
        me = node.index
        out: list[PeerId] = []
        seen: set[int] = set()
        tries = 0
        rng = node.rng
        while len(out) < k and tries < 4 * k + 64:
            tries += 1
            s = rng.randrange(n)
            peer = sessions[s]
            if peer == me or peer in seen:
                continue
            seen.add(peer)
            peer_id = mesh.peer_ids[peer]
            if live(node.rank(s)) and not view.knows(peer_id) and not node.membership.is_suspected(peer):
                out.append(peer_id)
        return out

    # --- messages -----------------------------------------------------------------------------------------
    def _enqueue(self, node: SimNode, peer: int, msg: ViewMessage) -> None:
        state = self.state(node)
        state.outbox.setdefault(peer, []).append(msg)
        if peer not in state.sending:
            self._deliver(node, peer)

    def _deliver(self, node: SimNode, peer: int) -> None:
        state = self.state(node)
        batch = state.outbox.pop(peer, None)
        if not batch or not node.alive:
            state.sending.pop(peer, None)
            return
        if len(batch) > MAX_BATCH:
            state.outbox[peer] = batch[MAX_BATCH:]
            batch = batch[:MAX_BATCH]
        self._serial += 1
        serial = state.sending[peer] = self._serial
        mesh = self.mesh
        sizes = mesh.sizes
        body = view_batch(
            [
                view_message(
                    sizes.example_peer,
                    sizes.example_addrs,
                    m.kind.value,
                    bool(m.peer),
                    m.ttl,
                    m.high,
                    len(m.sample),
                )
                for m in batch
            ]
        )
        other = mesh.nodes[peer]
        mesh.net.send(
            node.index,
            peer,
            sizes.flight(sizes.syn_view + body),
            OVERLAY,
            self._rpc_view,
            other,
            node.index,
            batch,
            serial,
        )
        mesh.loop.call_later(self.config.gossip_timeout, self._timeout, node, peer, serial)

    def _rpc_view(self, node: SimNode, sender: int, batch: list[ViewMessage], serial: int) -> None:
        node.membership.confirm_alive(sender)
        sender_id = self.mesh.peer_ids[sender]
        view = self.state(node).view
        for msg in batch:
            self._apply(node, view.receive, sender_id, msg)
        sizes = self.mesh.sizes
        _, nbytes = sizes.probe_like(0, sizes.view_ok)
        self.mesh.net.send(
            node.index, sender, nbytes, OVERLAY, self._acked, self.mesh.nodes[sender], node.index, serial
        )

    def _acked(self, node: SimNode, peer: int, serial: int) -> None:
        state = self.state(node)
        if state.sending.get(peer) == serial:
            self._deliver(node, peer)

    def _timeout(self, node: SimNode, peer: int, serial: int) -> None:
        state = self.state(node)
        if not node.alive or state.sending.get(peer) != serial:
            return
        state.sending.pop(peer, None)
        state.outbox.pop(peer, None)
        self._peer_failed(node, peer)

    # --- the drivers' questions -----------------------------------------------------------------------------
    def join(self, node: SimNode, contact: int) -> None:
        mesh = self.mesh
        state = self.state(node)
        contact_id = mesh.peer_ids[contact]
        state.ledger.protect(contact_id, BOOTSTRAP)
        mesh.net.connect(node.index, contact)
        node.gossip.expect_contact(contact)
        self._apply(node, state.view.join, contact_id)
        # The node agent releases its bootstrap peers once it has a neighbour (the contact is one at once).
        if state.view.active:
            state.ledger.unprotect(contact_id, BOOTSTRAP)
        else:
            mesh.loop.call_later(30.0, state.ledger.unprotect, contact_id, BOOTSTRAP)

    def leave(self, node: SimNode) -> None:
        self._apply(node, self.state(node).view.leave)

    def record_changed(self, node: SimNode, session: int, old: int, new: int) -> None:
        mesh = self.mesh
        follow_members(mesh, node, session, new)
        peer = mesh.session_node[session]
        if peer == node.index:
            return
        peer_id = mesh.peer_ids[peer]
        view = self.state(node).view
        if live(new):
            if view.wants_peers() and not view.knows(peer_id) and not node.membership.is_suspected(peer):
                self._apply(node, view.offer, [peer_id])
            return
        if not any(live(node.rank(mesh.session_index[s])) for s in mesh.node_sessions[peer]):
            if view.knows(peer_id):
                self._apply(node, view.forget, peer_id)

    def neighbours(self, node: SimNode) -> list[int] | None:
        state = self.state(node)
        if state.neighbours is None:
            index = self.mesh.node_index
            state.neighbours = [index[p] for p in state.view.active]
        return state.neighbours

    def _unsuspected(self, node: SimNode, peers: tuple[PeerId, ...]) -> list[int]:
        index = self.mesh.node_index
        membership = node.membership
        if not membership.unreachable and not membership.swim.suspects:
            return [index[p] for p in peers]
        return [i for p in peers if not membership.is_suspected(i := index[p])]

    def push_targets(self, node: SimNode) -> list[int]:
        neighbours = self._unsuspected(node, self.state(node).view.active)
        return node.rng.sample(neighbours, min(self.fanout, len(neighbours)))

    def anti_entropy_partner(self, node: SimNode) -> int | None:
        view = self.state(node).view
        rng = node.rng
        neighbours = self._unsuspected(node, view.active)
        passive = self._unsuspected(node, view.passive)
        if passive and (not neighbours or rng.random() < self.config.passive_anti_entropy):
            return rng.choice(passive)
        return rng.choice(neighbours) if neighbours else None

    def flush_targets(self, node: SimNode) -> list[int]:
        neighbours = self._unsuspected(node, self.state(node).view.active)
        if neighbours:
            return neighbours
        return self._live_peers.sample_live(node, max(1, self.fanout))

    def connected(self, node: SimNode, peer: int) -> None:
        self.state(node).ledger.opened(self.mesh.peer_ids[peer], self.mesh.loop.now)

    def disconnected(self, node: SimNode, peer: int) -> None:
        # Only a neighbour's connection is a transport-level signal: the others are closed on purpose.
        state = self.state(node)
        state.ledger.closed(self.mesh.peer_ids[peer])
        if state.view.is_active(self.mesh.peer_ids[peer]):
            self._peer_failed(node, peer)

    # --- connection limits ----------------------------------------------------------------------------------
    def _trim(self, node: SimNode) -> None:
        if not node.alive:
            return
        mesh = self.mesh
        interval = (
            max(0.05, min(TRIM_INTERVAL, self.fabric.conn_idle_timeout / 4))
            if self.fabric.conn_idle_timeout
            else TRIM_INTERVAL
        )
        mesh.loop.call_later(interval, self._trim, node)
        state = self.state(node)
        activity = mesh.net.activity
        assert activity is not None
        used = activity[node.index]
        now = mesh.loop.now
        ledger = state.ledger
        peer_ids = mesh.peer_ids
        for peer in mesh.net.conns[node.index]:
            ledger.observe(peer_ids[peer], 0, active=peer in used, now=now)
        used.clear()
        decision = ledger.trim(now)
        for peer_id in (*decision.idle, *decision.excess):
            mesh.net.close(node.index, mesh.node_index[peer_id])
