"""Replication over the simulated network: `gossip.py`'s push and anti-entropy, with the real message sizes.

Push: every change to a replica is batched with the others made in the same instant and sent, as a push stream,
to the overlay's push targets (in a full mesh `fanout` random live peers; over partial views up to `fanout`
unsuspected neighbours, each record kept from the peer it came from). A node with no target drops the batch, as
the real push loop does.

Anti-entropy every `anti_entropy_interval` (times 0.5-1.5) with the overlay's partner, and the "hello" the
overlay asks for (full mesh: every new connection; partial views: a new neighbour of a node that has not synced
within an interval): the initiator sends its digest's hash; equal hashes end the round; otherwise the responder
sends its digest, the initiator its want list and the records the responder lacks, the responder the records
wanted. Each side's records are merged through `SimNode.receive`, which applies the eviction rules.

A joiner's first sync runs the real `join_sync.JoinSync` plan: each new neighbour is asked for one part of the
keys (its digest and both record lists limited to that part), the bootstrap contact only after the wait.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from opentela.registry.join_sync import JoinSync, shard_of
from opentela.registry.sim.network import ANTI_ENTROPY, PUSH

if TYPE_CHECKING:
    from opentela.registry.sim.node import SimNode

Records = list[tuple[int, int, int]]
"""(session index, rank, eviction signer or -1): the records a message carries."""
Part = tuple[tuple[int, ...], int] | None
"""The shards of a split first sync and their count (None: every key)."""
_PART_BYTES = 6
"""What "s" and "k" add to a "sum" message (msgpack: two short keys, a small list and an integer)."""
_UNSYNCED_BYTES = 3
"""What "u": 1 adds to a digest."""
"""What "s" and "k" add to a "sum" message (msgpack: two short keys, a small list and an integer)."""


def in_part(session: int, part: Part) -> bool:
    """Whether a session's key falls in `part` (sessions are keyed by their index here)."""
    return part is None or shard_of(str(session), part[1]) in part[0]


class SimGossip:
    """One node's replication driver."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.mesh = node.mesh
        self.config = node.mesh.registry_config
        self._pending: dict[int, int | None] = {}  # session -> the peer it came from (None: our own write)
        self._scheduled = False
        self.synced_at: float | None = None
        """When our latest anti-entropy round completed."""
        self.plan: JoinSync | None = None
        if self.config.join_sync_shards > 1 and self.mesh.overlay.floods:
            self.plan = JoinSync(self.config.join_sync_shards, self.config.join_sync_wait)
        self._pulls = 0  # serial of the part pulls, to time out the right one
        self._pulling: dict[int, int] = {}  # peer -> serial of the part pull in flight
        self.counters: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<SimGossip pending={len(self._pending)} rounds={self.counters['rounds']}>"

    def start(self, phase: float) -> None:
        """Start the anti-entropy loop `phase` seconds from now."""
        self.mesh.loop.call_later(phase, self._anti_entropy_loop)

    # --- push ---------------------------------------------------------------------------------------------
    def changed(self, session: int, origin: int | None) -> None:
        """A record changed our replica (from `origin`, or our own write): push it with this instant's batch."""
        self._pending.setdefault(session, origin)
        if not self._scheduled:
            self._scheduled = True
            self.mesh.loop.call_later(0.0, self._push)

    def _push(self) -> None:
        self._scheduled = False
        node = self.node
        if not node.alive:
            return
        batch, self._pending = self._pending, {}
        if not batch or self.config.fanout == 0:
            return
        targets = node.overlay.push_targets(node)
        if not targets:
            return
        records = [node.outgoing(s, node.rank(s)) for s in batch]
        if not node.overlay.floods:
            self.push(targets, records)
            return
        sources = list(batch.values())
        for peer in targets:  # flooding: a record is not sent back to the peer it came from
            mine = [r for r, source in zip(records, sources, strict=True) if source != peer]
            if mine:
                self.push([peer], mine)

    def push(self, targets: list[int], records: Records) -> None:
        """Push `records` to each of `targets` (one stream each)."""
        mesh, node = self.mesh, self.node
        total = sum(mesh.record_bytes(r[1]) for r in records)
        nbytes, _ = mesh.sizes.push(total, len(records), self.config.max_records_per_message)
        for peer in targets:
            self.counters["pushes_sent"] += 1
            mesh.net.send(
                node.index,
                peer,
                nbytes,
                PUSH,
                mesh.nodes[peer].gossip.rpc_push,
                node.index,
                records,
                records=len(records),
            )

    def rpc_push(self, sender: int, records: Records) -> None:
        """Records pushed to us."""
        mesh = self.mesh
        mesh.net.send(self.node.index, sender, mesh.sizes.push(0, 0, 1)[1], PUSH, None)  # our FIN
        self.counters["pushes_received"] += 1
        self.node.membership.confirm_alive(sender)
        self.node.receive(records, sender)

    # --- anti-entropy -------------------------------------------------------------------------------------
    def _anti_entropy_loop(self) -> None:
        node = self.node
        if not node.alive:
            return
        self.mesh.loop.call_later(
            self.config.anti_entropy_interval * (0.5 + node.rng.random()), self._anti_entropy_loop
        )
        if self.joining:
            return  # the first sync is under way, in parts
        peer = node.overlay.anti_entropy_partner(node)
        if peer is not None:
            self.exchange(peer)

    # --- a joiner's split first sync (gossip.py's _on_neighbour, _join_sync_loop, _pull_shards) ---------------
    def expect_contact(self, contact: int) -> None:
        """We are joining through `contact`: ask it for parts only if no other neighbour comes in time."""
        if self.plan is not None:
            self.plan.contacts = self.plan.contacts | {self.mesh.peer_ids[contact]}

    def neighbour_up(self, peer: int) -> bool:
        """A new neighbour: pull a part from it while our first sync is incomplete; False when not joining."""
        plan = self.plan
        if self.synced_at is not None or plan is None or plan.complete or not plan.contacts:
            return False
        first = plan.started is None
        shards = plan.on_neighbour(self.mesh.peer_ids[peer], self.mesh.loop.now)
        if shards:
            self._pull(peer, shards)
        if first:
            # Our record to the first neighbour at once (gossip.py): it floods it.
            node = self.node
            self.push([peer], [node.outgoing(node.session, node.rank(node.session))])
            self.mesh.loop.call_later(plan.wait, self._join_sync_tick)
        return True

    def _join_sync_tick(self) -> None:
        plan, node = self.plan, self.node
        assert plan is not None
        if not node.alive or self.synced_at is not None or plan.complete:
            return
        neighbours = [self.mesh.peer_ids[p] for p in node.overlay.push_targets(node)]
        for peer_id, shards in plan.reassign(sorted(neighbours), self.mesh.loop.now).items():
            self._pull(self.mesh.node_index[peer_id], shards)
        self.mesh.loop.call_later(plan.wait, self._join_sync_tick)

    def _pull(self, peer: int, shards: tuple[int, ...]) -> None:
        assert self.plan is not None
        self._pulls += 1
        self.exchange(peer, (shards, self.plan.shards))
        self.mesh.loop.call_later(self.config.gossip_timeout, self._pull_timeout, peer, self._pulls)

    def _pull_timeout(self, peer: int, serial: int) -> None:
        plan = self.plan
        assert plan is not None
        peer_id = self.mesh.peer_ids[peer]
        if peer_id in plan.pulling and self._pulling.get(peer) == serial:
            plan.finished(peer_id, ok=False)

    @property
    def joining(self) -> bool:
        """Whether our first sync runs in parts now (gossip.py's `_joining`)."""
        plan = self.plan
        return plan is not None and bool(plan.contacts) and self.synced_at is None and not plan.complete

    @property
    def synced(self) -> bool:
        """Whether our replica is complete as far as we know (gossip.py's `synced`; warm starts hold the base)."""
        return (
            self.synced_at is not None
            or self.mesh.replicas.based[self.node.index]
            or not (self.plan is not None and self.plan.contacts)
        )

    def _part_done(self, peer: int, whole: bool = True) -> None:
        plan = self.plan
        assert plan is not None
        plan.finished(self.mesh.peer_ids[peer], ok=whole)
        if plan.complete and self.synced_at is None:
            self.synced_at = self.mesh.loop.now

    # --- anti-entropy rounds ------------------------------------------------------------------------------
    def exchange(self, peer: int, part: Part = None) -> None:
        """Start one anti-entropy round with `peer` (over `part`'s keys only, when given)."""
        mesh = self.mesh
        sizes = mesh.sizes
        self.counters["rounds"] += 1
        if part is not None:
            self._pulling[peer] = self._pulls
        mesh.net.send(
            self.node.index,
            peer,
            sizes.flight(sizes.syn_gossip + sizes.gossip_sum + (_PART_BYTES if part else 0)),
            ANTI_ENTROPY,
            mesh.nodes[peer].gossip.rpc_sum,
            self.node.index,
            part,
            self.synced,
        )

    def rpc_sum(self, caller: int, part: Part = None, caller_synced: bool = True) -> None:
        """The initiator's digest hash: answer "same", or our digest (of `part`'s keys)."""
        mesh, node = self.mesh, self.node
        node.membership.confirm_alive(caller)
        sizes = mesh.sizes
        them = mesh.nodes[caller].gossip
        if mesh.replicas.same(node.index, caller):
            if caller_synced:  # equal to a synced replica: ours is complete too
                self.synced_at = mesh.loop.now
            _, nbytes = sizes.probe_like(0, sizes.gossip_same)
            mesh.net.send(
                node.index, caller, nbytes, ANTI_ENTROPY, them.on_same, node.index, part, self.synced
            )
            return
        if part is None:
            entries = mesh.replicas.known[node.index]
        else:
            self.counters["parts_served"] += 1
            entries = sum(1 for s in mesh.replicas.entries(node.index) if in_part(s, part))
        digest = sizes.framed(sizes.digest(entries) + (0 if self.synced else _UNSYNCED_BYTES))
        mesh.net.send(
            node.index,
            caller,
            sizes.flight(digest),
            ANTI_ENTROPY,
            them.on_digest,
            node.index,
            part,
            self.synced,
        )

    def on_same(self, peer: int, part: Part = None, whole: bool = True) -> None:
        """Nothing differed (which proves our replica complete only if the responder's is)."""
        self.counters["rounds_same"] += 1
        if part is not None:
            self._part_done(peer, whole)
        elif whole:
            self.synced_at = self.mesh.loop.now

    def on_digest(self, peer: int, part: Part = None, whole: bool = True) -> None:
        """The responder's digest: send what it lacks and ask for what we lack."""
        mesh, node = self.mesh, self.node
        if not node.alive:
            return
        ours, theirs = mesh.replicas.diff(node.index, peer)
        if part is not None:
            # Our own record goes in every part (gossip.py): until a neighbour holds it, nobody floods it for us.
            ours = [e for e in ours if e[0] == node.session or in_part(e[0], part)]
            theirs = [e for e in theirs if in_part(e[0], part)]
        sizes = mesh.sizes
        step = self.config.max_records_per_message
        total = sum(mesh.record_bytes(rank) for _, rank in ours)
        sent = [node.outgoing(s, rank) for s, rank in ours]
        nbytes = (
            sizes.framed(sizes.want(len(theirs)))
            + sizes.records_message(total, len(ours), step)
            + sizes.framed(sizes.gossip_end)
        )
        wanted = [s for s, _ in theirs]
        mesh.net.send(
            node.index,
            peer,
            sizes.flight(nbytes),
            ANTI_ENTROPY,
            mesh.nodes[peer].gossip.on_wanted,
            node.index,
            sent,
            wanted,
            part,
            whole,
            records=len(sent),
        )

    def on_wanted(
        self, caller: int, records: Records, wanted: list[int], part: Part = None, whole: bool = True
    ) -> None:
        """The initiator's records and want list: merge them, then send what it wants."""
        mesh, node = self.mesh, self.node
        # While we join, what a neighbour sends is what the mesh holds already: merged, not pushed on.
        node.receive(records, caller, flood=not self.joining)
        if part is None and self.synced_at is None and mesh.nodes[caller].gossip.synced:
            self.synced_at = mesh.loop.now  # a synced initiator sent us all it had: we hold it all
        send = [node.outgoing(s, r) for s in wanted if (r := node.rank(s)) >= 0]
        sizes = mesh.sizes
        total = sum(mesh.record_bytes(r[1]) for r in send)
        body = sizes.records_message(total, len(send), self.config.max_records_per_message)
        nbytes = sizes.flight(body + sizes.framed(sizes.gossip_end) + sizes.rst_cancel)
        them = mesh.nodes[caller].gossip
        mesh.net.send(
            node.index,
            caller,
            nbytes,
            ANTI_ENTROPY,
            them.on_records,
            node.index,
            send,
            part,
            whole,
            records=len(send),
        )

    def on_records(self, peer: int, records: Records, part: Part = None, whole: bool = True) -> None:
        """The responder's records: the end of the round."""
        if self.node.alive:
            # A part of our first sync: records our synced neighbours hold already, so not pushed on.
            self.node.receive(records, peer, flood=part is None)
            if part is not None:
                self._part_done(peer, whole)
            elif whole:
                self.synced_at = self.mesh.loop.now
