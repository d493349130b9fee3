"""Who a simulated node talks to: the full mesh of today, or partial views (`view_overlay.py`).

An overlay answers the drivers' questions (whom to push to, whom to run anti-entropy with, whom SWIM watches,
whom to tell when leaving) and follows the replica and the connections. The full mesh is today's behaviour, as
`gossip.py` and `membership.py` had it before partial views: SWIM watches every live session (round robin over
all of them), a change is pushed to `fanout` random live peers, anti-entropy picks a random live peer, a node
leaving pushes its LEFT record to every live peer, and connections, once dialed, stay open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from opentela.registry.sim.replica import is_live

if TYPE_CHECKING:
    from opentela.registry.sim.mesh import Mesh
    from opentela.registry.sim.node import SimNode

_EXACT_BELOW = 64  # below this many sessions, live peers are listed outright instead of sampled


class Overlay(Protocol):
    """What the drivers ask of the overlay; `node` is the asking node."""

    def warm_start(self, count: int) -> None:
        """Nodes [0, count) have just been built, knowing one another."""

    def join(self, node: SimNode, contact: int) -> None:
        """A new node joins through `contact`."""

    def leave(self, node: SimNode) -> None:
        """`node` leaves in order."""

    def record_changed(self, node: SimNode, session: int, old: int, new: int) -> None:
        """Another session's record changed `node`'s replica."""

    floods: bool
    """Whether a record is kept from the peer it came from (flooding) or pushed to random peers regardless."""

    def neighbours(self, node: SimNode) -> list[int] | None:
        """The peers SWIM probes (None: every member)."""

    def push_targets(self, node: SimNode) -> list[int]:
        """Peers a batch of changes goes to."""

    def anti_entropy_partner(self, node: SimNode) -> int | None:
        """The peer of the next anti-entropy round."""

    def flush_targets(self, node: SimNode) -> list[int]:
        """Peers a leaving node tells."""

    def connected(self, node: SimNode, peer: int) -> None:
        """A connection to `peer` came up."""

    def disconnected(self, node: SimNode, peer: int) -> None:
        """The connection to `peer` went away."""


live = is_live
"""JOIN or SERVING."""


class FullMeshOverlay:
    """Today: everyone watches, pushes to and exchanges with everyone."""

    floods = False

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.fanout = mesh.registry_config.fanout

    def __repr__(self) -> str:
        return f"<FullMeshOverlay fanout={self.fanout}>"

    def warm_start(self, count: int) -> None:
        mesh = self.mesh
        mesh.net.full_mesh(count)
        shared_roster(mesh, count)

    def join(self, node: SimNode, contact: int) -> None:
        self.mesh.net.connect(node.index, contact)

    def leave(self, node: SimNode) -> None:
        pass

    def record_changed(self, node: SimNode, session: int, old: int, new: int) -> None:
        follow_members(self.mesh, node, session, new)

    def neighbours(self, node: SimNode) -> list[int] | None:
        return None

    def push_targets(self, node: SimNode) -> list[int]:
        return self.sample_live(node, self.fanout)

    def anti_entropy_partner(self, node: SimNode) -> int | None:
        peers = self.sample_live(node, 1)
        return peers[0] if peers else None

    def flush_targets(self, node: SimNode) -> list[int]:
        return self._all_live(node)

    def connected(self, node: SimNode, peer: int) -> None:
        node.gossip.exchange(peer)  # every new connection starts with an exchange (gossip's hello)

    def disconnected(self, node: SimNode, peer: int) -> None:
        node.membership.suspect(peer)

    # --- gossip's live_peers --------------------------------------------------------------------------------
    def _usable(self, node: SimNode, peer: int, session: int) -> bool:
        mesh = self.mesh
        if live(mesh.replicas.rank(node.index, session)) and not node.membership.is_suspected(peer):
            return True
        return mesh.net.is_connected(node.index, peer)

    def _all_live(self, node: SimNode) -> list[int]:
        mesh = self.mesh
        me = node.index
        peers = {p for s, p in enumerate(mesh.session_node) if p != me and self._usable(node, p, s)}
        return sorted(peers)

    def sample_live(self, node: SimNode, k: int) -> list[int]:
        """Up to `k` distinct random peers of `Gossip.live_peers` (live records not suspected, and connected
        peers): listed outright in small meshes, drawn by rejection in large ones (the same distribution)."""
        mesh = self.mesh
        sessions = mesh.session_node
        n = len(sessions)
        rng = node.rng
        if n < _EXACT_BELOW:
            peers = self._all_live(node)
            return rng.sample(peers, min(k, len(peers)))
        me = node.index
        chosen: list[int] = []
        tries = 0
        while len(chosen) < k and tries < 40 * k:
            tries += 1
            s = rng.randrange(n)
            peer = sessions[s]
            if peer != me and peer not in chosen and self._usable(node, peer, s):
                chosen.append(peer)
        if len(chosen) < k:  # a nearly empty mesh: list what there is
            peers = [p for p in self._all_live(node) if p not in chosen]
            chosen += rng.sample(peers, min(k - len(chosen), len(peers)))
        return chosen


def follow_members(mesh: Mesh, node: SimNode, session: int, rank: int) -> None:
    """SWIM's members follow the replica: every live session but ours (`Membership.tick`'s sync)."""
    swim = node.membership.swim
    sid = mesh.session_ids[session]
    if live(rank):
        if sid not in swim.members:
            swim.add(sid, mesh.peer_ids[mesh.session_node[session]])
    elif sid in swim.members:
        swim.remove(sid)


def shared_roster(mesh: Mesh, count: int) -> None:
    """Warm-start nodes [0, count) share one roster of each other's sessions as their SWIM members."""
    roster = {mesh.session_ids[s]: mesh.peer_ids[mesh.session_node[s]] for s in range(count)}
    for node in mesh.nodes[:count]:
        node.membership.swim.use_roster(roster)


def overlay_for(mesh: Mesh) -> Overlay:
    """The overlay a mesh's mode asks for."""
    if mesh.config.mode == "full_mesh":
        return FullMeshOverlay(mesh)
    from opentela.registry.sim.view_overlay import ViewOverlay

    return ViewOverlay(mesh)
