"""The registry's G-Map CRDT: session id -> record, merged by the greater (lifecycle, version). Pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from opentela._types import SessionId
from opentela.registry.record import NodeRecord

Digest = dict[SessionId, tuple[int, int]]
"""session id -> (lifecycle rank, version): what a replica holds, without the payloads."""


def merge(a: NodeRecord, b: NodeRecord) -> NodeRecord:
    """The join of two records for the same key: commutative, associative and idempotent.

    The greater (lifecycle, version) wins, so a lifecycle never goes back. Equal ranks with different content
    only happen when an owner signs two versions with one number; the signed bytes then break the tie, so
    every replica still picks the same one.
    """
    if a.rank != b.rank:
        return a if a.rank > b.rank else b
    if a is b or a.signature == b.signature:
        return a
    return a if (a.signing_payload(), a.signature) >= (b.signing_payload(), b.signature) else b


class GMap:
    """A replica of the map; `apply` is the merge of one record into it."""

    def __init__(self) -> None:
        self._records: dict[SessionId, NodeRecord] = {}

    def __repr__(self) -> str:
        return f"<GMap {len(self._records)} records>"

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._records

    def get(self, session_id: SessionId) -> NodeRecord | None:
        """The record under `session_id`, if any."""
        return self._records.get(session_id)

    def items(self) -> Iterator[tuple[SessionId, NodeRecord]]:
        """All (session id, record) pairs."""
        return iter(self._records.items())

    def values(self) -> Iterator[NodeRecord]:
        """All records."""
        return iter(self._records.values())

    def apply(self, record: NodeRecord) -> bool:
        """Merge `record` in; True when the stored value changed."""
        current = self._records.get(record.session_id)
        merged = record if current is None else merge(current, record)
        if merged is current:
            return False
        self._records[record.session_id] = merged
        return True

    def digest(self) -> Digest:
        """(rank, version) of every key."""
        return {sid: r.rank for sid, r in self._records.items()}

    def newer_than(self, digest: Mapping[SessionId, tuple[int, int]]) -> list[NodeRecord]:
        """Records the digest's owner lacks or holds in an older version."""
        out = []
        for sid, record in self._records.items():
            theirs = digest.get(sid)
            if theirs is None or tuple(theirs) < record.rank:
                out.append(record)
        return out

    def wanted_from(self, digest: Mapping[SessionId, tuple[int, int]]) -> list[SessionId]:
        """Keys the digest's owner holds in a newer version than we do."""
        out = []
        for sid, rank in digest.items():
            ours = self._records.get(sid)
            if ours is None or ours.rank < tuple(rank):
                out.append(sid)
        return out

    def remove(self, session_id: SessionId) -> NodeRecord | None:
        """Drop a key outright; only tombstone compaction (`Registry.collect_garbage`) calls this."""
        return self._records.pop(session_id, None)
