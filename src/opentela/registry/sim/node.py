"""A simulated node: its session, its replica (in the shared store), SWIM, gossip and its place in the overlay.

`receive` is `Registry.apply_remote` reduced to what the simulation tracks: records are merged by rank, the
owners' own records before evictions (so an evictor that joined in the same batch counts), and an eviction
signed by another member goes through SWIM's evidence check first. `write` and `evict` are the owner's and the
evictor's writes: a new rank in the replica, which the gossip driver pushes.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from opentela._types import Lifecycle, SessionId
from opentela.registry.sim.probes import SimMembership
from opentela.registry.sim.replica import is_live, lifecycle_of, rank_of, version_of
from opentela.registry.sim.replication import Records, SimGossip

if TYPE_CHECKING:
    from opentela.registry.sim.mesh import Mesh
    from opentela.registry.sim.overlays import Overlay

LEFT = int(Lifecycle.LEFT)
NO_FLOOD = -2
"""`Mesh.origin` while merging records that are not pushed on (a joiner's first sync)."""


class SimNode:
    """One node of the simulated mesh."""

    def __init__(self, mesh: Mesh, index: int, session: int, overlay: Overlay, rng: random.Random) -> None:
        self.mesh = mesh
        self.index = index
        self.session = session
        self.session_id: SessionId = mesh.session_ids[session]
        self.peer_id = mesh.peer_ids[index]
        self.overlay = overlay
        self.rng = rng
        self.alive = True
        self.joined_at = mesh.loop.now
        self.membership = SimMembership(self)
        self.gossip = SimGossip(self)
        self.view_state: object | None = None
        """The overlay's per-node state (a PartialView and its driver state), if any."""
        self.evicted_by: dict[int, int] = {}
        """Session -> signer of the eviction this replica holds for it (LEFT records written by others)."""

    def __repr__(self) -> str:
        return f"<SimNode {self.index} session={self.session} alive={self.alive}>"

    def start(self) -> None:
        """Start the protocol period and the anti-entropy loop at random phases."""
        config = self.mesh.registry_config
        self.membership.start(self.rng.uniform(0.0, config.probe_interval))
        self.gossip.start(self.rng.uniform(0.0, config.anti_entropy_interval))

    # --- the replica ----------------------------------------------------------------------------------------
    def rank(self, session: int) -> int:
        """The rank this node's replica holds for `session`."""
        return self.mesh.replicas.rank(self.index, session)

    def write(self, lifecycle: Lifecycle) -> int:
        """The owner writes the next version of its own record."""
        old = self.rank(self.session)
        rank = rank_of(lifecycle, version_of(old) + 1 if old >= 0 else 1)
        self.mesh.owner_wrote(self.session, rank)
        self.mesh.replicas.apply(self.index, self.session, rank)
        return rank

    def evict(self, session_id: SessionId) -> bool:
        """Write LEFT for another node's live session (`Registry.evict`); False when it is not live here."""
        session = self.mesh.session_index[session_id]
        current = self.rank(session)
        if not is_live(current) or session == self.session:
            return False
        rank = rank_of(Lifecycle.LEFT, version_of(current) + 1)
        self.mesh.eviction_written(session, self.index)
        self.evicted_by[session] = self.index
        return self.mesh.replicas.apply(self.index, session, rank)

    def outgoing(self, session: int, rank: int) -> tuple[int, int, int]:
        """A record as it leaves this replica: (session, rank, signer of an eviction or -1)."""
        return (session, rank, self.evicted_by.get(session, -1) if rank >> 32 == LEFT else -1)

    def receive(self, records: Records, sender: int, flood: bool = True) -> None:
        """Merge records from `sender`: owners' own records first, evictions by others through the checks;
        `flood` False: what they change is not pushed on (a joiner's first sync, see gossip.py)."""
        mesh = self.mesh
        replicas = mesh.replicas
        evictions = []
        me = self.index
        mesh.origin = sender if flood else NO_FLOOD
        try:
            for record in records:
                if record[2] >= 0:
                    evictions.append(record)
                    continue
                replicas.apply(me, record[0], record[1])
            for session, rank, signer in evictions:
                current = replicas.rank(me, session)
                if rank < current:
                    continue
                if rank == current:
                    # The same eviction signed by another member: the greater signed bytes win (here the greater
                    # signer), and the replica that switches pushes it once more, as `GMap.apply` reports a change.
                    held = self.evicted_by.get(session, -1)
                    if 0 <= held < signer:
                        self.evicted_by[session] = signer
                        if flood:
                            self.gossip.changed(session, sender)
                    continue
                sid = mesh.session_ids[session]
                if self.membership.check_eviction(sid, rank, signer, is_live(current)):
                    self.evicted_by[session] = signer
                    replicas.apply(me, session, rank)
        finally:
            mesh.origin = None

    def release_evictions(self, session_id: SessionId, ranks: dict[int, int]) -> None:
        """Held evictions of `session_id` found their evidence: merge the latest."""
        if ranks:
            signer, rank = max(ranks.items(), key=lambda kv: (kv[1], kv[0]))
            session = self.mesh.session_index[session_id]
            if rank > self.rank(session):
                self.evicted_by[session] = signer
                self.mesh.replicas.apply(self.index, session, rank)

    def on_apply(self, session: int, old: int, new: int) -> None:
        """A record changed this replica: follow it in SWIM and the overlay, and push it on."""
        if session != self.session:
            self.overlay.record_changed(self, session, old, new)
        self.gossip.applied(session, new)
        if self.mesh.origin != NO_FLOOD:
            self.gossip.changed(session, self.mesh.origin)

    # --- connections ----------------------------------------------------------------------------------------
    def connected(self, peer: int) -> None:
        """A new connection to `peer` is up."""
        self.membership.confirm_alive(peer)
        self.overlay.connected(self, peer)

    def disconnected(self, peer: int) -> None:
        """The connection to `peer` is gone."""
        self.overlay.disconnected(self, peer)

    def serving(self) -> bool:
        """Whether this node's own record is SERVING."""
        return lifecycle_of(self.rank(self.session)) == int(Lifecycle.SERVING)
