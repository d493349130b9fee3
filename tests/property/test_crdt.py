"""The G-Map's laws, proved over generated records: merge is commutative, associative, idempotent; order is moot."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry.crdt import GMap, merge
from opentela.registry.record import ModelEntry, NodeRecord

OWNERS = [Identity.generate() for _ in range(3)]
SESSIONS = ["s-a", "s-b", "s-c"]


@st.composite
def records(draw: st.DrawFn, session: str | None = None) -> NodeRecord:
    owner = draw(st.sampled_from(OWNERS))
    record = NodeRecord(
        session_id=session or draw(st.sampled_from(SESSIONS)),
        peer_id=owner.peer_id,
        provider_id=draw(st.sampled_from(["lab-a", "lab-b", ""])),
        lifecycle=draw(st.sampled_from(list(Lifecycle))),
        version=draw(st.integers(0, 6)),
        addrs=tuple(draw(st.lists(st.sampled_from(["127.0.0.1:1", "10.0.0.1:2"]), max_size=2))),
        models=tuple(
            ModelEntry(m) for m in draw(st.lists(st.sampled_from(["m1", "m2"]), max_size=2, unique=True))
        ),
        hardware={"ram_mib": draw(st.integers(0, 4))},
        started_at=1.0,
        updated_at=float(draw(st.integers(0, 3))),
    )
    if record.lifecycle is Lifecycle.LEFT:
        record = record.tombstone()  # what every writer of LEFT sends (anything else is malformed)
    return record.signed(owner)


same_key = records(session="s-x")


@given(same_key, same_key)
def test_merge_is_commutative(a: NodeRecord, b: NodeRecord) -> None:
    assert merge(a, b) == merge(b, a)


@given(same_key, same_key, same_key)
def test_merge_is_associative(a: NodeRecord, b: NodeRecord, c: NodeRecord) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@given(same_key)
def test_merge_is_idempotent(a: NodeRecord) -> None:
    assert merge(a, a) == a


@given(same_key, same_key)
def test_merge_never_lowers_lifecycle_or_version(a: NodeRecord, b: NodeRecord) -> None:
    m = merge(a, b)
    assert m.rank == max(a.rank, b.rank)
    assert m in (a, b)


@settings(max_examples=60)
@given(st.lists(records(), min_size=1, max_size=6))
def test_replicas_converge_whatever_the_delivery_order(updates: list[NodeRecord]) -> None:
    states = set()
    for order in itertools.islice(itertools.permutations(updates), 24):
        gmap = GMap()
        for r in order:
            gmap.apply(r)
            gmap.apply(r)  # duplicates are harmless
        states.add(tuple(sorted((k, v.signature) for k, v in gmap.items())))
    assert len(states) == 1


@given(st.lists(same_key, min_size=1, max_size=8))
def test_lifecycle_never_goes_back_as_updates_arrive(updates: list[NodeRecord]) -> None:
    gmap = GMap()
    seen = []
    for r in updates:
        gmap.apply(r)
        seen.append(gmap.get("s-x").rank)
    assert seen == sorted(seen)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))


@given(records())
def test_wire_round_trip(record: NodeRecord) -> None:
    back = NodeRecord.from_wire(record.to_wire())
    assert back == record
    assert back.verify()


@given(records(), st.sampled_from(["provider_id", "version", "lifecycle", "addrs"]))
def test_any_tampering_breaks_the_signature(record: NodeRecord, field: str) -> None:
    changes = {
        "provider_id": record.provider_id + "x",
        "version": record.version + 1,
        "lifecycle": Lifecycle.JOIN if record.lifecycle is not Lifecycle.JOIN else Lifecycle.SERVING,
        "addrs": (*record.addrs, "6.6.6.6:6"),
    }
    assert not dataclasses.replace(record, **{field: changes[field]}).verify()


garbage = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)


@given(garbage)
def test_from_wire_on_garbage_raises_only_value_error(obj: object) -> None:
    try:
        NodeRecord.from_wire(obj)
    except ValueError:
        pass


@given(records(), st.sampled_from(list(NodeRecord.__dataclass_fields__)), garbage)
def test_from_wire_with_one_field_garbled_raises_only_value_error(
    record: NodeRecord, key: str, value: object
) -> None:
    wire = record.to_wire()
    wire[key] = value
    try:
        NodeRecord.from_wire(wire)
    except ValueError:
        pass
