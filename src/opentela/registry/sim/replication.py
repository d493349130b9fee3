"""Replication over the simulated network: `gossip.py`'s push and anti-entropy, with the real message sizes.

Push: every change to a replica is batched with the others made in the same instant and sent, as a push stream,
to the overlay's push targets (in a full mesh `fanout` random live peers; over partial views up to `fanout`
unsuspected neighbours, each record kept from the peer it came from). A node with no target drops the batch, as
the real push loop does.

Anti-entropy every `anti_entropy_interval` (times 0.5-1.5) with the overlay's partner, and the "hello" the
overlay asks for (full mesh: every new connection; partial views: a new neighbour of a node that has not synced
within an interval): the initiator sends its digest's hash; equal hashes end the round; otherwise the responder
sends its digest, the initiator its want list and the records the responder lacks, the responder the records
wanted. Each side's records are merged through `SimNode.receive`, which applies the eviction rules. A responder
holding enough keys answers a differing hash with class hashes instead (`digest_shards.py`), and sends the digest
of the classes the initiator names (those holding a key the two replicas disagree on).

A joiner's first sync runs the real `join_sync.JoinSync` plan: each new neighbour is asked for one part of the
keys (its digest and both record lists limited to that part), the bootstrap contact only after the wait.

Over partial views, pushes follow the real `lazy_push.LazyPush`: a lazy neighbour gets the ids of a batch's
SERVING records instead of the records (in the push stream that carries the batch's flooded records, if any), a
push that brought nothing newer than the replica is answered with a prune, and an id whose record has not come
within the graft timeout is asked of its announcer (a graft: the request, then the records in the answer).
Neighbours learn that each other understand ids from the "l" flag of
anti-entropy messages; the warm start's neighbours know it already, as nodes that have run together would.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from opentela.registry.digest_shards import shard_count
from opentela.registry.join_sync import JoinSync, shard_of
from opentela.registry.lazy_push import LazyPush
from opentela.registry.sim.network import ANTI_ENTROPY, LAZY, PUSH
from opentela.registry.sim.replica import lifecycle_of

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
        self.lazy: LazyPush[int, int, int] | None = None
        """Eager and lazy neighbours (partial views); peers and keys are node and session indices, ranks ints."""
        if self.mesh.overlay.floods:
            self.lazy = LazyPush(prune=self.mesh.config.lazy_push)
        self._graft_at: float | None = None  # when the next graft check is scheduled
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
        lazy = self.lazy
        for peer in targets:  # flooding: a record is not sent back to the peer it came from
            mine = [r for r, source in zip(records, sources, strict=True) if source != peer]
            if not mine:
                continue
            if lazy is not None and lazy.is_lazy(peer):
                # A lazy neighbour: the flooded records, and the ids of the others (gossip.py's _flood).
                flooded = [r for r in mine if lazy.flooded(lifecycle_of(r[1]))]
                ids = [(s, rank) for s, rank, _ in mine if not lazy.flooded(lifecycle_of(rank))]
                self.counters["ids_sent"] += len(ids)
                self.push([peer], flooded, ids)
            else:
                self.push([peer], mine)

    def push(self, targets: list[int], records: Records, ids: list[tuple[int, int]] | None = None) -> None:
        """Push `records` (and the ids of records not sent, to a lazy neighbour) to each of `targets` (one stream
        each)."""
        mesh, node = self.mesh, self.node
        total = sum(mesh.record_bytes(r[1]) for r in records)
        ids = ids or []
        nbytes, _ = mesh.sizes.push(total, len(records), self.config.max_records_per_message, len(ids))
        for peer in targets:
            self.counters["pushes_sent"] += 1
            mesh.net.send(
                node.index,
                peer,
                nbytes,
                PUSH if records else LAZY,
                mesh.nodes[peer].gossip.rpc_push,
                node.index,
                records,
                ids,
                records=len(records),
            )

    def rpc_push(self, sender: int, records: Records, ids: list[tuple[int, int]] | None = None) -> None:
        """Records pushed to us, and ids of records the sender holds."""
        mesh, node = self.mesh, self.node
        fin = mesh.sizes.push(0, 0, 1)[1]
        mesh.net.send(node.index, sender, fin, PUSH if records else LAZY, None)  # our FIN
        self.counters["pushes_received"] += 1
        node.membership.confirm_alive(sender)
        lazy = self.lazy
        if lazy is None:
            node.receive(records, sender)
            return
        now = mesh.loop.now
        if records:
            # Only records that go along the tree are judged, before merging (gossip.py's _on_push).
            judged = [(s, rank) for s, rank, _ in records if not lazy.flooded(lifecycle_of(rank))]
            fresh = any(rank > node.rank(session) for session, rank in judged)
            node.receive(records, sender)
            if judged and lazy.received(sender, fresh, now):
                self.prune(sender)
        for session, rank in ids or ():
            ours = node.rank(session)
            if lazy.announced(sender, session, rank, ours if ours >= 0 else None, now):
                self._schedule_grafts(now + lazy.graft_timeout)

    def applied(self, session: int, rank: int) -> None:
        """A record changed our replica, by whatever path: stop waiting for it if it was announced."""
        if self.lazy is not None:
            self.lazy.arrived(session, rank)

    # --- lazy push (gossip.py's _on_push, _graft_loop, _graft, _serve_graft) ------------------------------------
    def prune(self, peer: int) -> None:
        """Ask `peer` to send us ids instead of records (a push stream carrying the prune flag)."""
        mesh = self.mesh
        out = mesh.sizes.prune_stream()[0]
        mesh.net.send(self.node.index, peer, out, LAZY, mesh.nodes[peer].gossip.rpc_prune, self.node.index)

    def rpc_prune(self, sender: int) -> None:
        """A neighbour asks for ids instead of records."""
        mesh = self.mesh
        mesh.net.send(self.node.index, sender, mesh.sizes.prune_stream()[1], LAZY, None)  # our FIN
        self.node.membership.confirm_alive(sender)
        if self.lazy is not None:
            self.lazy.pruned(sender)

    def _schedule_grafts(self, at: float) -> None:
        if self._graft_at is None or at < self._graft_at:
            self._graft_at = at
            self.mesh.loop.call_at(at, self._graft_tick)

    def _graft_tick(self) -> None:
        lazy, node = self.lazy, self.node
        assert lazy is not None
        now = self.mesh.loop.now
        if self._graft_at is not None and self._graft_at <= now:
            self._graft_at = None
        if not node.alive:
            return
        for peer, keys in lazy.due(now).items():
            self.graft(peer, keys)
        due = lazy.next_due()
        if due is not None:
            self._schedule_grafts(max(due, now))

    def graft(self, peer: int, keys: list[int]) -> None:
        """Ask `peer` for the records of `keys`, which it announced and which did not come."""
        mesh = self.mesh
        self.counters["grafts_sent" if keys else "reeager_requests"] += 1
        them = mesh.nodes[peer].gossip
        mesh.net.send(
            self.node.index, peer, mesh.sizes.graft(len(keys)), LAZY, them.rpc_graft, self.node.index, keys
        )

    def rpc_graft(self, caller: int, keys: list[int]) -> None:
        """A neighbour asks for records we announced: send them, and records from now on."""
        mesh, node = self.mesh, self.node
        node.membership.confirm_alive(caller)
        if self.lazy is not None:
            self.lazy.grafted(caller)
        send = [node.outgoing(s, r) for s in keys if (r := node.rank(s)) >= 0]
        sizes = mesh.sizes
        total = sum(mesh.record_bytes(r[1]) for r in send)
        body = sizes.records_message(total, len(send), self.config.max_records_per_message)
        nbytes = sizes.flight(body + sizes.framed(sizes.gossip_end) + sizes.rst_cancel)
        them = mesh.nodes[caller].gossip
        mesh.net.send(node.index, caller, nbytes, LAZY, them.on_grafted, node.index, send, records=len(send))

    def on_grafted(self, peer: int, records: Records) -> None:
        """The records a graft asked for: merged and pushed on, like a push."""
        node = self.node
        if not node.alive:
            return
        node.receive(records, peer)
        if self.lazy is not None:
            for session, rank, _ in records:
                self.lazy.arrived(session, rank)

    def _learned(self, peer: int) -> None:
        if self.lazy is not None:
            self.lazy.learned(peer)

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

    def neighbour_down(self, peer: int) -> None:
        """A peer left our active view."""
        if self.lazy is not None:
            for lazy_peer in self.lazy.neighbour_down(peer):
                self.graft(lazy_peer, [])

    def neighbour_up(self, peer: int) -> bool:
        """A new neighbour: pull a part from it while our first sync is incomplete; False when not joining."""
        if self.lazy is not None:
            self.lazy.neighbour_up(peer)
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
        self._learned(caller)  # its "sum" says "l": 1
        sizes = mesh.sizes
        them = mesh.nodes[caller].gossip
        plan = self.plan
        if part is None and self.joining and plan and (plan.pulling or not plan.expired(mesh.loop.now)):
            # gossip.py's _parts_coming: a joiner declines whole rounds while its parts come (an unsynced "same").
            _, nbytes = sizes.probe_like(0, sizes.gossip_same + _UNSYNCED_BYTES)
            mesh.net.send(node.index, caller, nbytes, ANTI_ENTROPY, them.on_same, node.index, part, False)
            return
        if mesh.replicas.same(node.index, caller):
            if caller_synced:  # equal to a synced replica: ours is complete too
                self.synced_at = mesh.loop.now
            _, nbytes = sizes.probe_like(0, sizes.gossip_same)
            mesh.net.send(
                node.index, caller, nbytes, ANTI_ENTROPY, them.on_same, node.index, part, self.synced
            )
            return
        if part is None and (count := shard_count(mesh.replicas.known[node.index])):
            # Class hashes first (digest_shards.py): the initiator asks for the digest of the classes that differ.
            sums = sizes.framed(sizes.sums(count) + (0 if self.synced else _UNSYNCED_BYTES))
            mesh.net.send(
                node.index,
                caller,
                sizes.flight(sums),
                ANTI_ENTROPY,
                them.on_sums,
                node.index,
                count,
                self.synced,
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

    def on_sums(self, peer: int, count: int, whole: bool) -> None:
        """The responder's class hashes: ask for the digest of the classes where our replicas differ."""
        mesh, node = self.mesh, self.node
        if not node.alive:
            return
        self._learned(peer)
        self.counters["rounds_by_shards"] += 1
        ours, theirs = mesh.replicas.diff(node.index, peer)
        asked = sorted({shard_of(str(s), count) for s, _ in ours + theirs})
        sizes = mesh.sizes
        nbytes = sizes.flight(sizes.framed(sizes.shards(asked)))
        them = mesh.nodes[peer].gossip
        mesh.net.send(
            node.index, peer, nbytes, ANTI_ENTROPY, them.rpc_shards, node.index, (tuple(asked), count), whole
        )

    def rpc_shards(self, caller: int, restrict: Part, caller_whole: bool) -> None:
        """The classes the initiator asks about: our digest of those keys."""
        mesh, node = self.mesh, self.node
        sizes = mesh.sizes
        entries = sum(1 for s in mesh.replicas.entries(node.index) if in_part(s, restrict))
        digest = sizes.framed(sizes.digest(entries) + (0 if self.synced else _UNSYNCED_BYTES))
        them = mesh.nodes[caller].gossip
        mesh.net.send(
            node.index,
            caller,
            sizes.flight(digest),
            ANTI_ENTROPY,
            them.on_digest,
            node.index,
            None,
            self.synced,
            restrict,
        )

    def on_same(self, peer: int, part: Part = None, whole: bool = True) -> None:
        """Nothing differed (which proves our replica complete only if the responder's is)."""
        self.counters["rounds_same"] += 1
        self._learned(peer)
        if part is not None:
            self._part_done(peer, whole)
        elif whole:
            self.synced_at = self.mesh.loop.now

    def on_digest(self, peer: int, part: Part = None, whole: bool = True, restrict: Part = None) -> None:
        """The responder's digest (of `restrict`'s classes, in a round by shards): send what it lacks and ask for
        what we lack."""
        mesh, node = self.mesh, self.node
        if not node.alive:
            return
        self._learned(peer)
        ours, theirs = mesh.replicas.diff(node.index, peer)
        if restrict is not None:
            ours = [e for e in ours if in_part(e[0], restrict)]
            theirs = [e for e in theirs if in_part(e[0], restrict)]
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
