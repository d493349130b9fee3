"""The node's view of the mesh as the gateway and the fleet controller read it: the gateway's Mesh contract.

Reads go to the registry replica and the liveness layer; streams go out through the fabric host (or stay in
the process when the target is this node). The view owns no state but the failure counts it reports and, on an
ingress, which peers serve replicas (their connections are kept out of the connection limits); the node's
notices (node/notices.py) travel with its stats and health.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from opentela._types import (
    PROTO_BLOCKS,
    PROTO_CONTROL,
    PROTO_DEMAND,
    PROTO_HTTP,
    Lifecycle,
    PeerId,
    SessionId,
    Stream,
)
from opentela.errors import OpenTelaError
from opentela.fabric.connection_manager import SERVING
from opentela.fabric.host import Host
from opentela.fabric.memory import memory_stream_pair
from opentela.node._config import Role
from opentela.node.block_server import BlockServer
from opentela.node.control import ControlService
from opentela.node.http_service import LocalEngineProxy
from opentela.node.notices import Notices
from opentela.registry.gossip import Gossip
from opentela.registry.membership import Membership
from opentela.registry.overlay import Overlay
from opentela.registry.record import NodeRecord
from opentela.registry.registry import ChangeListener, Registry

Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]

# Transport failures that say the peer itself may be gone (not that one request went wrong).
_SUSPECT_CODES = ("peer_unreachable", "dial_timeout", "connection_closed")


class MeshView:
    """What the gateway (`opentela.gateway.mesh.Mesh`) and the controller need from a running node."""

    def __init__(
        self,
        host: Host,
        registry: Registry,
        membership: Membership,
        gossip: Gossip,
        proxy: LocalEngineProxy,
        control: ControlService,
        *,
        bootstrap: Sequence[str],
        spawn: Spawn,
        notices: Notices | None = None,
        overlay: Overlay | None = None,
    ) -> None:
        self.host, self.registry, self.membership, self.gossip = host, registry, membership, gossip
        self.overlay = overlay
        self.proxy, self.control = proxy, control
        self.bootstrap = tuple(bootstrap)
        self._spawn = spawn
        self.notices = notices if notices is not None else Notices()
        self.failures: dict[str, int] = {}
        self.blocks: BlockServer | None = None
        """This node's own block server, reached in-process."""
        self._serving: dict[
            PeerId, set[SessionId]
        ] = {}  # replica peer -> its SERVING sessions (ingress only)
        if Role.INGRESS.value in registry.local.roles:
            # The gateway routes to these peers at any moment: the connection limits must not close them.
            for record in registry.records():
                self._track_replica(record, False)
            registry.on_change(self._track_replica)

    def __repr__(self) -> str:
        return f"<MeshView {self.peer_id[-8:]} session={self.session_id[:8]} records={len(self.registry)}>"

    @property
    def peer_id(self) -> PeerId:
        """This node's peer id."""
        return self.registry.local.peer_id

    @property
    def session_id(self) -> SessionId:
        """This node's current session (it changes when the node rejoins)."""
        return self.registry.local.session_id

    @property
    def bootstrap_addr(self) -> str:
        """An address others can pass to --bootstrap to join through this node."""
        addrs = self.registry.local.addrs or tuple(self.host.listen_addrs) or ("?",)
        return f"{self.peer_id}@{addrs[0]}"

    def candidates(self, model: str) -> list[NodeRecord]:
        """SERVING replicas of `model` that are not suspected."""
        excluded = self.membership.is_excluded
        return [r for r in self.registry.candidates(model) if not excluded(r)]

    def live_records(self) -> list[NodeRecord]:
        """Visible JOIN and SERVING records, without the peers our liveness layer suspects."""
        now = time.time()
        return [
            r
            for r in self.registry.records()
            if self.registry.visible(r, now)
            and r.lifecycle <= Lifecycle.SERVING
            and not self.membership.is_excluded(r)
        ]

    def peer_count(self) -> int:
        """Live nodes other than this one: how many peers this node has joined."""
        return sum(1 for r in self.live_records() if r.peer_id != self.peer_id)

    def on_change(self, listener: ChangeListener) -> None:
        """Call `listener(record, local)` after every change applied to this replica."""
        self.registry.on_change(listener)

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        """SERVING records per model."""
        return self.registry.model_replicas()

    def known_model_ids(self) -> set[str]:
        """Every model any record has served."""
        return self.registry.known_models()

    def is_suspected(self, peer_id: PeerId) -> bool:
        """Local liveness verdict."""
        return self.membership.is_suspected(peer_id)

    async def open_http_stream(self, target: NodeRecord, timeout: float) -> Stream:
        """A tunnel stream to `target`; to ourselves it never leaves the process."""
        if target.session_id == self.session_id:
            ours, theirs = memory_stream_pair(PROTO_HTTP, self.peer_id, self.peer_id)
            self._spawn(self.proxy.handle_stream(theirs), "local-http")
            return ours
        return await self.host.open_stream(target.peer_id, PROTO_HTTP, addrs=target.addrs, timeout=timeout)

    def block_servers(self) -> list[NodeRecord]:
        """SERVING records that serve blocks of a split model, without the peers our liveness layer suspects."""
        return [r for r in self.live_records() if r.blocks and r.lifecycle is Lifecycle.SERVING]

    async def open_block_stream(self, target: NodeRecord, timeout: float) -> Stream:
        """A /otela/blocks/1 stream to `target`'s block server; to ourselves it never leaves the process."""
        if target.session_id == self.session_id and self.blocks is not None:
            ours, theirs = memory_stream_pair(PROTO_BLOCKS, self.peer_id, self.peer_id)
            self._spawn(self.blocks.handle_stream(theirs), "local-blocks")
            return ours
        return await self.host.open_stream(target.peer_id, PROTO_BLOCKS, addrs=target.addrs, timeout=timeout)

    async def open_control_stream(self, peer_id: PeerId, timeout: float) -> Stream:
        """A /otela/control/1 stream to `peer_id`, dialled at the addresses its live record gives."""
        addrs = next((r.addrs for r in self.live_records() if r.peer_id == peer_id), ())
        return await self.host.open_stream(peer_id, PROTO_CONTROL, addrs=addrs, timeout=timeout)

    def controllers(self) -> list[NodeRecord]:
        """Live records of fleet controllers (they start serverless models on demand)."""
        return [r for r in self.live_records() if "controller" in r.roles]

    async def open_demand_stream(self, peer_id: PeerId, timeout: float) -> Stream:
        """A /otela/demand/1 stream to the controller `peer_id`."""
        addrs = next((r.addrs for r in self.live_records() if r.peer_id == peer_id), ())
        return await self.host.open_stream(peer_id, PROTO_DEMAND, addrs=addrs, timeout=timeout)

    def report_failure(self, target: NodeRecord, error: OpenTelaError) -> None:
        """Transport failures make the liveness layer look at the peer now rather than at its next probe."""
        self.failures[target.session_id] = self.failures.get(target.session_id, 0) + 1
        if error.code in _SUSPECT_CODES:
            self.membership.suspect(target.peer_id, reason=error.code)

    def table(self) -> list[dict[str, Any]]:
        """Every record, JSON-ready."""
        return self.registry.snapshot()

    def peers(self) -> list[dict[str, Any]]:
        """Connected and known peers with their liveness."""
        return self.membership.snapshot()

    def rtt(self) -> dict[str, dict[str, float]]:
        """Measured round trips from this node to every live peer, ``{this peer: {peer: ms}}`` (an RTT file)."""
        live = {r.peer_id for r in self.live_records()}
        measured = self.membership.rtt.snapshot()
        return {self.host.peer_id: {p: m["ms"] for p, m in measured.items() if p in live}}

    def bootstraps(self) -> dict[str, Any]:
        """Configured bootstrap peers and our own joinable address."""
        return {"configured": list(self.bootstrap), "self": [self.bootstrap_addr]}

    def stats(self) -> dict[str, Any]:
        """Counters of every layer."""
        return {
            "registry": self.registry.stats(),
            "gossip": self.gossip.stats(),
            "membership": self.membership.stats(),
            "view": self.overlay.stats() if self.overlay is not None else None,
            "proxy": {
                "in_flight": self.proxy.in_flight,
                "served": self.proxy.served,
                "abandoned": self.proxy.abandoned,
            },
            "fabric": {"connections": self.host.connections.stats()},
            "relay": self.host.relay.stats(),
            "admission": {
                "network_id": self.host.admission.network_id or "open",
                "refused_peers": self.host.refused_not_member,
                "rejected_records": self.registry.counters["rejected_not_member"],
            },
            "failures_by_session": dict(self.failures),
            "control": dict(self.control.counters),
            "notices": self.notices.snapshot(),
            **({"blocks": self.blocks.stats()} if self.blocks is not None else {}),
        }

    def health(self) -> dict[str, Any]:
        """Liveness of this node."""
        local = self.registry.local
        return {
            "status": "ok" if local.lifecycle <= Lifecycle.SERVING else local.lifecycle.name.lower(),
            "peer_id": self.peer_id,
            "session_id": self.session_id,
            "state": local.lifecycle.name,
            "models": [m.id for m in local.models],
            "nodes_known": len(self.registry),
            # What the operator should act on (bootstrapped to itself, joined nobody...): `otela status` shows it.
            "notices": self.notices.snapshot(),
        }

    def _track_replica(self, record: NodeRecord, local: bool) -> None:
        # Tags belong to the peer while records belong to sessions: a restarted replica may hold an old SERVING
        # session and a new one at once, so the tag goes only when the peer's last one leaves SERVING.
        peer = record.peer_id
        if peer == self.peer_id:
            return
        sessions = self._serving.get(peer)
        if record.lifecycle is Lifecycle.SERVING and (record.models or record.blocks):
            if sessions is None:
                self._serving[peer] = {record.session_id}
                self.host.connections.protect(peer, SERVING)
            else:
                sessions.add(record.session_id)
        elif sessions is not None and record.session_id in sessions:
            sessions.discard(record.session_id)
            if not sessions:
                del self._serving[peer]
                self.host.connections.unprotect(peer, SERVING)
