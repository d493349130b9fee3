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
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from opentela.registry.sim.network import ANTI_ENTROPY, PUSH

if TYPE_CHECKING:
    from opentela.registry.sim.node import SimNode

Records = list[tuple[int, int, int]]
"""(session index, rank, eviction signer or -1): the records a message carries."""


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
        peer = node.overlay.anti_entropy_partner(node)
        if peer is not None:
            self.exchange(peer)

    def exchange(self, peer: int) -> None:
        """Start one anti-entropy round with `peer`."""
        mesh = self.mesh
        sizes = mesh.sizes
        self.counters["rounds"] += 1
        mesh.net.send(
            self.node.index,
            peer,
            sizes.flight(sizes.syn_gossip + sizes.gossip_sum),
            ANTI_ENTROPY,
            mesh.nodes[peer].gossip.rpc_sum,
            self.node.index,
        )

    def rpc_sum(self, caller: int) -> None:
        """The initiator's digest hash: answer "same", or our digest."""
        mesh, node = self.mesh, self.node
        node.membership.confirm_alive(caller)
        sizes = mesh.sizes
        them = mesh.nodes[caller].gossip
        if mesh.replicas.same(node.index, caller):
            self.synced_at = mesh.loop.now
            _, nbytes = sizes.probe_like(0, sizes.gossip_same)
            mesh.net.send(node.index, caller, nbytes, ANTI_ENTROPY, them.on_same)
            return
        digest = sizes.framed(sizes.digest(mesh.replicas.known[node.index]))
        mesh.net.send(node.index, caller, sizes.flight(digest), ANTI_ENTROPY, them.on_digest, node.index)

    def on_same(self) -> None:
        """Nothing differed."""
        self.counters["rounds_same"] += 1
        self.synced_at = self.mesh.loop.now

    def on_digest(self, peer: int) -> None:
        """The responder's digest: send what it lacks and ask for what we lack."""
        mesh, node = self.mesh, self.node
        if not node.alive:
            return
        ours, theirs = mesh.replicas.diff(node.index, peer)
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
            records=len(sent),
        )

    def on_wanted(self, caller: int, records: Records, wanted: list[int]) -> None:
        """The initiator's records and want list: merge them, then send what it wants."""
        mesh, node = self.mesh, self.node
        node.receive(records, caller)
        send = [node.outgoing(s, r) for s in wanted if (r := node.rank(s)) >= 0]
        sizes = mesh.sizes
        total = sum(mesh.record_bytes(r[1]) for r in send)
        body = sizes.records_message(total, len(send), self.config.max_records_per_message)
        nbytes = sizes.flight(body + sizes.framed(sizes.gossip_end) + sizes.rst_cancel)
        them = mesh.nodes[caller].gossip
        mesh.net.send(
            node.index, caller, nbytes, ANTI_ENTROPY, them.on_records, node.index, send, records=len(send)
        )

    def on_records(self, peer: int, records: Records) -> None:
        """The responder's records: the end of the round."""
        if self.node.alive:
            self.node.receive(records, peer)
            self.synced_at = self.mesh.loop.now
