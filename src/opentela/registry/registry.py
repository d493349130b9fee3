"""The registry facade: this node's own record, verified merging of others', views and change listeners."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from opentela._types import Lifecycle, PeerId, SessionId
from opentela.errors import AdmissionError
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.crdt import Digest, GMap
from opentela.registry.record import NodeRecord
from opentela.registry.views import RegistryViews

logger = logging.getLogger(__name__)

_DROP_LOG_INTERVAL = 10.0

ChangeListener = Callable[[NodeRecord, bool], None]
"""Called with (record, is_local) after a record changed the replica."""

EvictionListener = Callable[[NodeRecord, NodeRecord], object]
"""Called with (our record before, the eviction) when another member evicted our session; its result is unused."""

EvictionCheck = Callable[[NodeRecord], bool]
"""Decides whether a verified eviction signed by another member may merge now (False: held or dropped)."""


class Registry:
    """A full local replica of the mesh's registry; every read is local."""

    def __init__(
        self,
        identity: Identity,
        local: NodeRecord,
        *,
        config: RegistryConfig | None = None,
        admission: Admission | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if local.peer_id != identity.peer_id:
            raise ValueError("the local record must belong to this identity")
        self.identity = identity
        self.config = config or RegistryConfig()
        self.admission = admission or Admission.open()
        self.clock = clock
        self.map = GMap()
        self.views = RegistryViews()
        self._listeners: list[ChangeListener] = []
        self._eviction_listeners: list[EvictionListener] = []
        self._members: Counter[PeerId] = Counter()  # peer id -> records it owns here
        self._live_sessions: Counter[PeerId] = Counter()  # peer id -> its sessions here not yet LEFT
        self._tombstones: Counter[PeerId] = Counter()  # signer -> the LEFT records here it signed
        self._write_buckets: dict[PeerId, tuple[float, float]] = {}  # owner -> (tokens, when counted)
        self._drop_logged: dict[str, float] = {}  # counter -> when a drop of that kind was last logged
        self.last_own: NodeRecord | None = None
        """The latest record we signed for our current session (an eviction may have replaced it in the map)."""
        self.counters: Counter[str] = Counter()
        self.eviction_check: EvictionCheck | None = None
        """Set by the membership layer: evictions of live sessions merge only with evidence (membership.py)."""
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
        if old is None:
            self._members[record.peer_id] += 1
        was_live = old is not None and old.lifecycle < Lifecycle.LEFT
        is_live = record.lifecycle < Lifecycle.LEFT
        if is_live != was_live:
            self._live_sessions[record.peer_id] += 1 if is_live else -1
            if self._live_sessions[record.peer_id] <= 0:
                del self._live_sessions[record.peer_id]
        if old is not None and old.lifecycle is Lifecycle.LEFT:
            self._forget_tombstone(old)
        if record.lifecycle is Lifecycle.LEFT:
            self._tombstones[record.signer] += 1
        if record.session_id == self.session_id and record.signer == self.identity.peer_id:
            self.last_own = record
        self.views.update(old, record)
        for listener in self._listeners:
            listener(record, local)
        return True

    def _forget_tombstone(self, record: NodeRecord) -> None:
        self._tombstones[record.signer] -= 1
        if self._tombstones[record.signer] <= 0:
            del self._tombstones[record.signer]

    def on_evicted(self, listener: EvictionListener) -> None:
        """Register a listener for the eviction of our own session by another member."""
        self._eviction_listeners.append(listener)

    def update_local(self, **changes: Any) -> NodeRecord:
        """Write a new version of our own record (bumped, re-signed) and announce it."""
        changes.setdefault("updated_at", self.clock())
        base = self.local.tombstone() if changes.get("lifecycle") == Lifecycle.LEFT else self.local
        record = base.next(self.identity, **changes)
        self._apply(record, local=True)
        self.counters["local_updates"] += 1
        return record

    def start_session(self, record: NodeRecord) -> NodeRecord:
        """Carry on under a new session (after our old one was evicted): `record` becomes the local record."""
        if record.peer_id != self.identity.peer_id or record.session_id in self.map:
            raise ValueError("a new session needs a fresh session id of this identity")
        record = (
            record if record.verify() and record.signer == record.peer_id else record.signed(self.identity)
        )
        self.session_id = record.session_id
        self._apply(record, local=True)
        self.counters["sessions_restarted"] += 1
        return record

    def evict(self, session_id: SessionId, reason: str) -> NodeRecord | None:
        """Write LEFT for another node's live session, signed by us with `reason`; None when it is not live."""
        current = self.map.get(session_id)
        if current is None or current.lifecycle > Lifecycle.SERVING or session_id == self.session_id:
            return None
        eviction = current.tombstone(
            version=current.version + 1, reason=reason, updated_at=self.clock()
        ).signed(self.identity)
        self._apply(eviction, local=True)
        self.counters["evictions_written"] += 1
        logger.info(
            "evicted a session",
            extra={"session": session_id[:12], "peer_id": current.peer_id, "reason": reason},
        )
        return eviction

    def is_member(self, peer_id: PeerId) -> bool:
        """Whether `peer_id` has (or had, within retention) a session in the registry: who may evict."""
        return peer_id == self.identity.peer_id or peer_id in self._members

    def apply_remote(self, records: Iterable[NodeRecord]) -> list[NodeRecord]:
        """Verify and merge records from a peer; returns those that changed the replica.

        Evictions are applied after the owners' own records of the same batch, so an evictor that joins and
        evicts within one anti-entropy delta is already a member when its eviction is checked.
        """
        changed = []
        now = self.clock()
        ordered = sorted(records, key=lambda r: r.signer != r.peer_id)
        for record in ordered:
            if record.session_id == self.session_id and record.signer == self.identity.peer_id:
                # Our own record echoed back: we are its only writer, nothing to learn.
                continue
            skew = self.config.max_clock_skew
            if record.updated_at > now + skew or record.started_at > now + skew:
                # Stamped ahead of our clock: it would never age out.
                self._dropped(
                    "rejected_future",
                    "dropped a record stamped in the future",
                    extra={"session": record.session_id[:12], "claimed_peer": record.peer_id},
                )
                continue
            if now - record.updated_at > self.config.tombstone_retention:
                # Older than any record may live: it was compacted here or will be; taking it back would
                # resurrect a dead session from a replica that slept through its eviction.
                self.counters["rejected_expired"] += 1
                continue
            if not record.verify():
                self._dropped(
                    "rejected_bad_signature",
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
                self._dropped(
                    "rejected_not_member",
                    "dropped a record from a non-member: %s",
                    refusal,
                    extra={"session": record.session_id[:12], "claimed_peer": record.peer_id},
                )
                continue
            if record.signer != record.peer_id and not self.is_member(record.signer):
                self._dropped(
                    "rejected_not_member",
                    "dropped an eviction signed by a non-member",
                    extra={"session": record.session_id[:12], "signer": record.signer},
                )
                continue
            # Limits come after the signature: a forged record must not spend its claimed owner's allowance.
            refusal = self._over_limits(record, now)
            if refusal is not None:
                self._dropped(
                    refusal,
                    "dropped a record: %s",
                    refusal.removeprefix("rejected_").replace("_", " "),
                    extra={"session": record.session_id[:12], "claimed_peer": record.peer_id},
                )
                continue
            if record.signer != record.peer_id and self.eviction_check and not self.eviction_check(record):
                continue  # held until this node has evidence of its own, or dropped; counted by the check
            before = self.local if record.session_id == self.session_id else None
            if self._apply(record, local=False):
                changed.append(record)
                if before is not None and self.map.get(self.session_id) is record:
                    self.counters["evicted"] += 1
                    logger.warning(
                        "our session was evicted by another member",
                        extra={
                            "session": self.session_id[:12],
                            "signer": record.signer,
                            "reason": record.reason,
                        },
                    )
                    for listener in self._eviction_listeners:
                        listener(before, record)
                self.counters["applied"] += 1
            else:
                self.counters["stale"] += 1
        return changed

    def _dropped(self, counter: str, message: str, *args: Any, extra: dict[str, Any] | None = None) -> None:
        """Count a refused record; warn about the first of each kind every `_DROP_LOG_INTERVAL` seconds only,
        so a member sending garbage cannot fill the disk through our log (the counters keep the totals)."""
        self.counters[counter] += 1
        now = time.monotonic()
        if now - self._drop_logged.get(counter, -_DROP_LOG_INTERVAL) >= _DROP_LOG_INTERVAL:
            self._drop_logged[counter] = now
            logger.warning(message, *args, extra={**(extra or {}), "total": self.counters[counter]})
        else:
            logger.debug(message, *args, extra=extra)

    def _over_limits(self, record: NodeRecord, now: float) -> str | None:
        """The counter naming why a verified `record` may not enter now (None: it may).

        A peer with too many live sessions, or writing faster than any honest node does, is flooding. Refusals
        are safe in a CRDT: anti-entropy offers the record again later, and an honest one is taken then.
        """
        if record.peer_id == self.identity.peer_id and record.signer == record.peer_id:
            return None  # our own older sessions: not a flood
        current = self.map.get(record.session_id)
        if current is not None and record.rank <= current.rank:
            return None  # changes nothing: merge counts it as stale
        if current is None and record.lifecycle < Lifecycle.LEFT:
            live = self._live_sessions.get(record.peer_id, 0)
            if live >= self.config.max_sessions_per_peer:
                return "rejected_session_limit"
        if current is None and record.lifecycle is Lifecycle.LEFT:
            # The end of a session this replica never saw stops nothing here; it only adds weight, for
            # tombstone_retention. Counted by signer: peer ids are free to make up, signers must be members.
            # Ends of sessions held here always merge.
            if self._tombstones.get(record.signer, 0) >= self.config.max_tombstones_per_signer:
                return "rejected_tombstone_limit"
        if record.signer == record.peer_id and not self._write_allowed(record.peer_id, now):
            return "rejected_write_rate"
        return None

    def _write_allowed(self, peer_id: PeerId, now: float) -> bool:
        """A token bucket per owner: `write_burst` writes at once, then `write_rate` per second."""
        rate, burst = self.config.write_rate, float(self.config.write_burst)
        tokens, then = self._write_buckets.get(peer_id, (burst, now))
        tokens = min(burst, tokens + (now - then) * rate)
        if tokens < 1.0:
            self._write_buckets[peer_id] = (tokens, now)
            return False
        self._write_buckets[peer_id] = (tokens - 1.0, now)
        if len(self._write_buckets) > 4 * max(len(self._members), 64):
            # Forget full buckets of peers gone quiet, so the table stays the size of the mesh.
            self._write_buckets = {
                p: (t, at) for p, (t, at) in self._write_buckets.items() if t + (now - at) * rate < burst
            }
        return True

    def _not_member(self, record: NodeRecord) -> str | None:
        """Why a closed network keeps `record` out of the replica (None: it may enter)."""
        if not self.admission.is_closed:
            return None
        try:
            self.admission.check(record.membership, record.peer_id, provider_id=record.provider_id)
        except AdmissionError as exc:
            return exc.message
        return None

    def apply_wire(self, objs: Iterable[Any]) -> list[NodeRecord]:
        """Parse untrusted wire records, dropping malformed ones, then `apply_remote`."""
        records = []
        for obj in objs:
            try:
                records.append(NodeRecord.from_wire(obj, max_bytes=self.config.max_record_bytes))
            except ValueError as exc:
                self._dropped("rejected_malformed", "dropped a malformed record: %s", exc)
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

    def visible(self, record: NodeRecord, now: float | None = None) -> bool:
        """Whether `record` belongs in the node view: DOWN and LEFT records leave it after `left_retention`."""
        if record.lifecycle < Lifecycle.DOWN:
            return True
        return (self.clock() if now is None else now) - record.updated_at <= self.config.left_retention

    def snapshot(self) -> list[dict[str, Any]]:
        """Every visible record as JSON, for the read-only table endpoint."""
        now = self.clock()
        return [r.to_json() for r in self.map.values() if self.visible(r, now)]

    def collect_garbage(self) -> dict[str, int]:
        """Hide dead records past `left_retention`; compact every record not written for `tombstone_retention`.

        A compacted record cannot come back: `apply_remote` refuses records that old, and live owners re-sign
        theirs every `refresh_interval`, so only dead sessions ever get that old.
        """
        now = self.clock()
        expired = [
            sid
            for sid, r in self.map.items()
            if sid != self.session_id and now - r.updated_at > self.config.tombstone_retention
        ]
        for sid in expired:
            removed = self.map.remove(sid)
            if removed is not None:
                self.views.update(removed, None)
                if removed.lifecycle < Lifecycle.LEFT:
                    self._live_sessions[removed.peer_id] -= 1
                    if self._live_sessions[removed.peer_id] <= 0:
                        del self._live_sessions[removed.peer_id]
                else:
                    self._forget_tombstone(removed)
                self._members[removed.peer_id] -= 1
                if self._members[removed.peer_id] <= 0:
                    del self._members[removed.peer_id]
        self.counters["compacted"] += len(expired)
        # Models announced only by records that left the node view are forgotten (404 again, not 503).
        visible = [r for r in self.map.values() if self.visible(r, now)]
        self.views.forget_models_except({m for r in visible for m in r.model_ids})
        hidden = len(self.map) - len(visible)
        return {"compacted": len(expired), "hidden": hidden, "records": len(self.map)}

    def stats(self) -> dict[str, Any]:
        """Counters and sizes."""
        by_state = Counter(r.lifecycle.name for r in self.map.values())
        hidden = sum(1 for r in self.map.values() if not self.visible(r))
        return {"records": len(self.map), "hidden": hidden, "by_state": dict(by_state), **self.counters}
