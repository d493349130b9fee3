"""The registry facade: this node's own record, verified merging of others', views and change listeners."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from opentela._types import PeerId, SessionId
from opentela.errors import AdmissionError
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.crdt import Digest, GMap
from opentela.registry.record import NodeRecord
from opentela.registry.views import RegistryViews

logger = logging.getLogger(__name__)

ChangeListener = Callable[[NodeRecord, bool], None]
"""Called with (record, is_local) after a record changed the replica."""


class Registry:
    """A full local replica of the mesh's registry; every read is local."""

    def __init__(
        self,
        identity: Identity,
        local: NodeRecord,
        *,
        config: RegistryConfig | None = None,
        admission: Admission | None = None,
    ) -> None:
        if local.peer_id != identity.peer_id:
            raise ValueError("the local record must belong to this identity")
        self.identity = identity
        self.config = config or RegistryConfig()
        self.admission = admission or Admission.open()
        self.map = GMap()
        self.views = RegistryViews()
        self._listeners: list[ChangeListener] = []
        self.counters: Counter[str] = Counter()
        self.session_id = local.session_id
        if local.membership != self.admission.proof:
            local = dataclasses.replace(local, membership=self.admission.proof)  # re-signed just below
        self._apply(local if local.verify() else local.signed(identity), local=True)

    def __repr__(self) -> str:
        return f"<Registry {len(self.map)} records, local {self.local!r}>"

    def __len__(self) -> int:
        return len(self.map)

    @property
    def local(self) -> NodeRecord:
        """This node's own current record."""
        record = self.map.get(self.session_id)
        assert record is not None
        return record

    def on_change(self, listener: ChangeListener) -> None:
        """Register a listener for applied changes."""
        self._listeners.append(listener)

    def _apply(self, record: NodeRecord, *, local: bool) -> bool:
        old = self.map.get(record.session_id)
        if not self.map.apply(record):
            return False
        self.views.update(old, record)
        for listener in self._listeners:
            listener(record, local)
        return True

    def update_local(self, **changes: Any) -> NodeRecord:
        """Write a new version of our own record (bumped, re-signed) and announce it."""
        record = self.local.next(self.identity, **changes)
        self._apply(record, local=True)
        self.counters["local_updates"] += 1
        return record

    def apply_remote(self, records: Iterable[NodeRecord]) -> list[NodeRecord]:
        """Verify and merge records from a peer; returns those that changed the replica."""
        changed = []
        for record in records:
            if record.session_id == self.session_id and record.signer == self.identity.peer_id:
                # Our own record echoed back: we are its only writer, nothing to learn.
                continue
            if not record.verify():
                self.counters["rejected_bad_signature"] += 1
                logger.warning(
                    "dropped a record with a bad signature",
                    extra={
                        "session": record.session_id[:12],
                        "claimed_peer": record.peer_id,
                        "signer": record.signer,
                    },
                )
                continue
            refusal = self._not_member(record)
            if refusal is not None:
                self.counters["rejected_not_member"] += 1
                logger.warning(
                    "dropped a record from a non-member: %s",
                    refusal,
                    extra={"session": record.session_id[:12], "claimed_peer": record.peer_id},
                )
                continue
            if self._apply(record, local=False):
                changed.append(record)
                self.counters["applied"] += 1
            else:
                self.counters["stale"] += 1
        return changed

    def _not_member(self, record: NodeRecord) -> str | None:
        """Why a closed network keeps `record` out of the replica (None: it may enter)."""
        if not self.admission.is_closed:
            return None
        try:
            self.admission.check(record.membership, record.peer_id, provider_id=record.provider_id)
        except AdmissionError as exc:
            return exc.message
        if record.signer != record.peer_id and not self._is_member(record.signer):
            return f"an eviction signed by {record.signer}, who is not a known member"
        return None

    def _is_member(self, peer_id: PeerId) -> bool:
        # Every record in the replica passed admission, so a peer with one is a member (evictions are rare).
        return peer_id == self.identity.peer_id or any(r.peer_id == peer_id for r in self.map.values())

    def apply_wire(self, objs: Iterable[Any]) -> list[NodeRecord]:
        """Parse untrusted wire records, dropping malformed ones, then `apply_remote`."""
        records = []
        for obj in objs:
            try:
                records.append(NodeRecord.from_wire(obj))
            except ValueError as exc:
                self.counters["rejected_malformed"] += 1
                logger.warning("dropped a malformed record: %s", exc)
        return self.apply_remote(records)

    # --- reads --------------------------------------------------------------------------------------------
    def get(self, session_id: SessionId) -> NodeRecord | None:
        """One record."""
        return self.map.get(session_id)

    def records(self) -> list[NodeRecord]:
        """Every record."""
        return list(self.map.values())

    def candidates(self, model: str) -> list[NodeRecord]:
        """SERVING records of `model`: a dictionary read."""
        return self.views.candidates(model)

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        """Every served model and its SERVING records."""
        return self.views.model_replicas()

    def known_models(self) -> set[str]:
        """Every model ever announced."""
        return self.views.known_models()

    def digest(self) -> Digest:
        """(rank, version) per key, for anti-entropy."""
        return self.map.digest()

    def snapshot(self) -> list[dict[str, Any]]:
        """Every record as JSON, for the read-only table endpoint."""
        return [r.to_json() for r in self.map.values()]

    def stats(self) -> dict[str, Any]:
        """Counters and sizes."""
        by_state = Counter(r.lifecycle.name for r in self.map.values())
        return {"records": len(self.map), "by_state": dict(by_state), **self.counters}
