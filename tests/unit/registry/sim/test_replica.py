"""The compact replicas merge as the real CRDT does: same winner per key, equal digests exactly when equal."""

from __future__ import annotations

import random

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry.crdt import GMap
from opentela.registry.record import NodeRecord
from opentela.registry.sim.replica import UNKNOWN, ReplicaStore, lifecycle_of, rank_of, version_of


def test_compact_replicas_agree_with_gmap_under_any_delivery_order() -> None:
    rng = random.Random(7)
    identity = Identity.generate()
    sessions = [f"s{i}" for i in range(6)]
    # Each session's owner writes a few versions, lifecycles never going back.
    records = []
    for s in sessions:
        life, version = Lifecycle.JOIN, 1
        for _ in range(rng.randint(1, 4)):
            records.append(
                NodeRecord(
                    session_id=s, peer_id=identity.peer_id, provider_id="p", lifecycle=life, version=version
                )
            )
            version += 1
            life = Lifecycle(min(3, int(life) + rng.randint(0, 1)))
    base = [rank_of(Lifecycle.JOIN, 1)] * 3  # sessions 0-2 known to the warm-start replicas
    store = ReplicaStore(base)
    replicas = [store.add_replica(based=True), store.add_replica(based=True), store.add_replica(based=False)]
    maps = [GMap() for _ in replicas]
    for i in range(2):
        for s in range(3):
            maps[i].apply(records[[r.session_id for r in records].index(f"s{s}")])
    for step in range(200):
        who = rng.randrange(3)
        record = rng.choice(records)
        s = int(record.session_id[1:])
        changed = store.apply(replicas[who], s, rank_of(record.lifecycle, record.version))
        assert changed == maps[who].apply(record), step
        for r, m in zip(replicas, maps, strict=True):
            digest = m.digest()
            assert {f"s{s}": (lifecycle_of(k), version_of(k)) for s, k in store.entries(r).items()} == digest
            assert store.known[r] == len(digest)
        for a in range(3):
            for b in range(3):
                assert store.same(replicas[a], replicas[b]) == (maps[a].digest() == maps[b].digest())


def test_diff_is_newer_than_and_wanted_from() -> None:
    store = ReplicaStore([rank_of(Lifecycle.SERVING, 2)] * 4)
    a, b, c = store.add_replica(based=True), store.add_replica(based=True), store.add_replica(based=False)
    store.apply(a, 1, rank_of(Lifecycle.LEFT, 3))
    store.apply(b, 2, rank_of(Lifecycle.SERVING, 3))
    store.apply(b, 4, rank_of(Lifecycle.JOIN, 1))
    mine, theirs = store.diff(a, b)
    assert mine == [(1, rank_of(Lifecycle.LEFT, 3))]
    assert sorted(theirs) == [(2, rank_of(Lifecycle.SERVING, 3)), (4, 1)]
    store.apply(c, 9, rank_of(Lifecycle.JOIN, 1))
    mine, theirs = store.diff(c, a)
    assert mine == [(9, 1)] and len(theirs) == 4 and store.rank(c, 0) == UNKNOWN
