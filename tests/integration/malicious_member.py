"""A mesh member that misbehaves, built from the project's own classes: it joins like any node, then sends what
an honest node never would (malformed or oversized records, evictions of others, probes, floods).

Tests of the mesh's defences use it against real `otela start` processes; it is the attacker, not a fake.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from opentela._types import PROTO_GOSSIP, Lifecycle, PeerId, ProtocolName
from opentela.fabric.admission import Admission
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.messages import write_msg
from opentela.registry.record import ModelEntry, NodeRecord


class MaliciousMember:
    """A member of the mesh (a valid identity, admitted like any node) that sends crafted traffic."""

    def __init__(self, identity: Identity, host: Host, peer: PeerId) -> None:
        self.identity = identity
        self.host = host
        self.peer = peer  # the node it connected to (usually the ingress)

    def __repr__(self) -> str:
        return f"<MaliciousMember {self.identity.peer_id[-8:]} -> {self.peer[-8:]}>"

    @classmethod
    async def join(
        cls, bootstrap: str, *, identity: Identity | None = None, admission: Admission | None = None
    ) -> MaliciousMember:
        """Connect to the node at `bootstrap` ("host:port") as a member (of a closed network with `admission`)."""
        identity = identity or Identity.generate()
        host = await Host.create(identity, admission=admission)
        try:
            peer = await host.connect(bootstrap)
        except BaseException:
            await host.aclose()
            raise
        return cls(identity, host, peer)

    async def __aenter__(self) -> MaliciousMember:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Leave: close the fabric host."""
        await self.host.aclose()

    @property
    def peer_id(self) -> PeerId:
        """This member's own peer id."""
        return self.identity.peer_id

    def record(self, *, model: str = "sim", signer: Identity | None = None, **fields: Any) -> NodeRecord:
        """A SERVING record of `model` owned by this member, with `fields` overriding any field (valid or not),
        signed by `signer` (this member by default). The constructor checks nothing, so anything goes."""
        now = time.time()
        values: dict[str, Any] = {
            "session_id": uuid.uuid4().hex,
            "peer_id": self.peer_id,
            "provider_id": "mallory",
            "lifecycle": Lifecycle.SERVING,
            "version": 1,
            "addrs": tuple(self.host.listen_addrs),
            "models": (ModelEntry(model, "simulated"),),
            "started_at": now,
            "updated_at": now,
        }
        values.update(fields)
        return NodeRecord(**values).signed(signer or self.identity)

    def eviction(self, victim: Mapping[str, Any] | NodeRecord, *, reason: str = "suspected") -> NodeRecord:
        """A LEFT record for someone else's session (a record, or its row from /v1/dnt/table), signed by this
        member: what SWIM writes for a node it believes dead."""
        if not isinstance(victim, NodeRecord):
            row = dict(victim)
            row["lifecycle"] = (
                Lifecycle[row["lifecycle"]] if isinstance(row["lifecycle"], str) else row["lifecycle"]
            )
            row["signature"] = b""
            row["membership"] = bytes.fromhex(row["membership"]) if row.get("membership") else b""
            row["models"] = tuple(
                ModelEntry(m["id"], m.get("engine", ""), m.get("settings", {})) for m in row["models"]
            )
            victim = NodeRecord(**{k: v for k, v in row.items() if k in NodeRecord.__dataclass_fields__})
        return victim.tombstone().next(self.identity, lifecycle=Lifecycle.LEFT, reason=reason)

    async def push(
        self, records: Iterable[NodeRecord | Mapping[str, Any]], *, to: PeerId | None = None
    ) -> None:
        """Gossip `records` (records, or raw wire maps for shapes a NodeRecord cannot hold) as a push."""
        wire = [r.to_wire() if isinstance(r, NodeRecord) else dict(r) for r in records]
        stream = await self.host.open_stream(to or self.peer, PROTO_GOSSIP)
        await write_msg(stream, {"t": "push", "r": wire})
        await stream.write_eof()

    async def open(self, protocol: ProtocolName, *, to: PeerId | None = None) -> Any:
        """A raw stream to the peer it joined (or `to`) speaking `protocol`, for hand-made messages."""
        return await self.host.open_stream(to or self.peer, protocol)
