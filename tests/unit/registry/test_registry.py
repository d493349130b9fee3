"""The registry facade: signature checks at the door, views that follow the lifecycle, listeners."""

from __future__ import annotations

import dataclasses

import pytest

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry


def record_for(identity: Identity, session: str = "s1", **kw: object) -> NodeRecord:
    base = NodeRecord(
        session_id=session,
        peer_id=identity.peer_id,
        provider_id="lab",
        lifecycle=Lifecycle.JOIN,
        version=1,
        addrs=("127.0.0.1:1",),
    )
    return dataclasses.replace(base, **kw).signed(identity)


@pytest.fixture
def me() -> Identity:
    return Identity.generate()


@pytest.fixture
def registry(me: Identity) -> Registry:
    return Registry(me, record_for(me, "local"))


def test_views_follow_join_serving_down(registry: Registry) -> None:
    other = Identity.generate()
    join = record_for(other)
    serving = join.next(other, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m", "vllm"),))
    down = serving.next(other, lifecycle=Lifecycle.DOWN)
    assert registry.apply_remote([join]) == [join]
    assert registry.candidates("m") == [] and "m" not in registry.known_models()
    registry.apply_remote([serving])
    assert registry.candidates("m") == [serving]
    assert registry.model_replicas() == {"m": [serving]}
    registry.apply_remote([down])
    assert registry.candidates("m") == []
    assert "m" in registry.known_models(), "a DOWN node's model stays known (503, not 404)"
    # An older version arriving late changes nothing.
    assert registry.apply_remote([serving]) == []
    assert registry.get(join.session_id).lifecycle is Lifecycle.DOWN


@pytest.mark.parametrize("tamper", ["field", "wrong_signer", "foreign_serving", "left_without_reason"])
def test_bad_signatures_never_reach_the_views(registry: Registry, tamper: str) -> None:
    owner, stranger = Identity.generate(), Identity.generate()
    good = record_for(owner, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    if tamper == "field":
        bad = dataclasses.replace(good, provider_id="someone-else")
    elif tamper == "wrong_signer":
        bad = dataclasses.replace(good, signer=stranger.peer_id)
    elif tamper == "foreign_serving":
        bad = good.signed(stranger)  # a stranger may not write SERVING for someone else's node
    else:
        bad = dataclasses.replace(good, lifecycle=Lifecycle.LEFT, version=9, reason="").signed(stranger)
    assert registry.apply_remote([bad]) == []
    assert registry.get(good.session_id) is None
    assert registry.candidates("m") == []
    assert registry.stats()["rejected_bad_signature"] == 1


def test_eviction_signed_by_another_member_is_accepted(registry: Registry) -> None:
    owner, evictor = Identity.generate(), Identity.generate()
    serving = record_for(owner, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    left = dataclasses.replace(serving, lifecycle=Lifecycle.LEFT, reason="evicted: no answer").signed(evictor)
    # The evictor's own record arrives in the same batch, after the eviction: it is still a member in time.
    registry.apply_remote([serving, left, record_for(evictor, "evictor-session")])
    assert registry.get(serving.session_id).lifecycle is Lifecycle.LEFT
    assert registry.candidates("m") == []


def test_eviction_by_a_non_member_never_reaches_the_views(registry: Registry) -> None:
    owner, outsider = Identity.generate(), Identity.generate()
    serving = record_for(owner, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    registry.apply_remote([serving])
    left = dataclasses.replace(serving, lifecycle=Lifecycle.LEFT, version=2, reason="evicted").signed(
        outsider
    )
    assert registry.apply_remote([left]) == []
    assert registry.get(serving.session_id) == serving and registry.candidates("m") == [serving]
    assert registry.stats()["rejected_not_member"] == 1


def test_unsigned_eviction_is_dropped(registry: Registry) -> None:
    owner, evictor = Identity.generate(), Identity.generate()
    serving = record_for(owner, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    registry.apply_remote([serving, record_for(evictor, "evictor-session")])
    unsigned = dataclasses.replace(
        serving,
        lifecycle=Lifecycle.LEFT,
        version=2,
        reason="evicted",
        signer=evictor.peer_id,
        signature=bytes(64),
    )
    assert registry.apply_remote([unsigned]) == []
    assert registry.candidates("m") == [serving]


def test_evict_writes_left_signed_by_us_and_concurrent_evictions_agree(me: Identity) -> None:
    owner, other = Identity.generate(), Identity.generate()
    serving = record_for(owner, lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    ours, theirs = Registry(me, record_for(me, "mine")), Registry(other, record_for(other, "theirs"))
    for reg in (ours, theirs):
        reg.apply_remote([serving, ours.local, theirs.local])
    a, b = ours.evict(serving.session_id, "no answer"), theirs.evict(serving.session_id, "no answer")
    assert a is not None and b is not None and a.signer == me.peer_id and a.reason == "no answer"
    assert a.rank == b.rank == (int(Lifecycle.LEFT), serving.version + 1)
    ours.apply_remote([b])
    theirs.apply_remote([a])
    assert ours.get(serving.session_id) == theirs.get(serving.session_id), "one deterministic winner"
    assert ours.evict(serving.session_id, "again") is None, "only live sessions are evicted"
    assert ours.evict("mine", "self") is None


def test_eviction_of_our_own_session_is_reported(registry: Registry, me: Identity) -> None:
    evictor = Identity.generate()
    registry.apply_remote([record_for(evictor, "evictor-session")])
    serving = registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    seen = []
    registry.on_evicted(lambda before, eviction: seen.append((before, eviction)))
    eviction = dataclasses.replace(serving, lifecycle=Lifecycle.LEFT, version=3, reason="silent").signed(
        evictor
    )
    registry.apply_remote([eviction])
    assert seen == [(serving, eviction)] and registry.local == eviction
    fresh = dataclasses.replace(serving, session_id="local-2", version=1).signed(me)
    registry.start_session(fresh)
    assert registry.local == fresh and registry.candidates("m") == [fresh]
    assert registry.get("local").lifecycle is Lifecycle.LEFT


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_dead_records_leave_the_view_then_are_compacted_and_never_come_back(me: Identity) -> None:
    clock = Clock()
    config = RegistryConfig(left_retention=100, tombstone_retention=1000, refresh_interval=10)
    registry = Registry(me, record_for(me, "local", updated_at=clock.now), config=config, clock=clock)
    owner = Identity.generate()
    serving = record_for(
        owner, "gone", lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),), updated_at=clock.now
    )
    live = record_for(Identity.generate(), "live", lifecycle=Lifecycle.SERVING, updated_at=clock.now)
    left = serving.next(owner, lifecycle=Lifecycle.LEFT, reason="shutdown", updated_at=clock.now)
    registry.apply_remote([serving, live, left])
    assert {r["session_id"] for r in registry.snapshot()} == {"local", "gone", "live"}
    assert "m" in registry.known_models()

    clock.now += 101
    assert registry.collect_garbage() == {"compacted": 0, "hidden": 1, "records": 3}
    assert {r["session_id"] for r in registry.snapshot()} == {"local", "live"}
    assert "gone" in registry.digest(), "a hidden tombstone still replicates"
    assert "m" not in registry.known_models(), "an old model is unknown again (404, not 503)"

    clock.now += 900
    live_refreshed = registry.get("live")
    assert registry.collect_garbage()["compacted"] == 2, "the silent live record expires as well"
    assert registry.get("gone") is None and registry.get("live") is None and registry.local is not None
    # An old replica re-gossips what it still holds: the SERVING record that never heard of the LEFT.
    assert registry.apply_remote([serving, left, live_refreshed]) == []
    assert registry.stats()["rejected_expired"] == 3
    assert registry.candidates("m") == []


def test_refusal_of_old_records_spares_fresh_ones(me: Identity) -> None:
    clock = Clock()
    config = RegistryConfig(left_retention=100, tombstone_retention=1000, refresh_interval=10)
    registry = Registry(me, record_for(me, "local"), config=config, clock=clock)
    other = Identity.generate()
    assert registry.apply_remote([record_for(other, "a", updated_at=clock.now - 999)])
    assert not registry.apply_remote([record_for(other, "b", updated_at=clock.now - 1001)])


def test_malformed_wire_records_are_counted_and_dropped(registry: Registry) -> None:
    other = Identity.generate()
    good = record_for(other).to_wire()
    assert len(registry.apply_wire([{"nonsense": 1}, "x", good])) == 1
    assert registry.stats()["rejected_malformed"] == 2


def test_local_updates_bump_version_resign_and_notify(registry: Registry, me: Identity) -> None:
    seen = []
    registry.on_change(lambda rec, local: seen.append((rec.lifecycle, rec.version, local)))
    rec = registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
    assert rec.version == 2 and rec.verify() and rec.signer == me.peer_id
    assert seen == [(Lifecycle.SERVING, 2, True)]
    assert registry.candidates("m") == [rec]
    snap = {r["session_id"]: r for r in registry.snapshot()}
    assert snap["local"]["lifecycle"] == "SERVING" and snap["local"]["models"][0]["id"] == "m"


def test_own_record_is_never_overwritten_by_an_echo(registry: Registry, me: Identity) -> None:
    forged_newer = registry.local.next(me, lifecycle=Lifecycle.LEFT)
    assert registry.apply_remote([forged_newer]) == []
    assert registry.local.lifecycle is Lifecycle.JOIN


def test_tombstones_of_unseen_sessions_are_capped_per_signer_and_ends_of_held_sessions_always_merge(
    me: Identity,
) -> None:
    clock = Clock()
    config = RegistryConfig(
        max_tombstones_per_signer=3, left_retention=100, tombstone_retention=1000, refresh_interval=10
    )
    registry = Registry(me, record_for(me, "local", updated_at=clock.now), config=config, clock=clock)
    evictor, owner = Identity.generate(), Identity.generate()
    held = record_for(owner, "held", lifecycle=Lifecycle.SERVING, updated_at=clock.now)
    registry.apply_remote([record_for(evictor, "evictor", updated_at=clock.now), held])

    def ending(session: str) -> NodeRecord:
        # The end of a session this replica never saw, of a peer id made up for it.
        ghost = record_for(Identity.generate(), session, lifecycle=Lifecycle.SERVING, updated_at=clock.now)
        return ghost.tombstone(version=2, reason="suspected", updated_at=clock.now).signed(evictor)

    assert len(registry.apply_remote([ending(f"ghost-{i}") for i in range(5)])) == 3
    assert registry.stats()["rejected_tombstone_limit"] == 2
    # Past the cap, the end of a session held here still merges: it is what stops it.
    eviction = held.tombstone(version=held.version + 1, reason="suspected", updated_at=clock.now).signed(
        evictor
    )
    assert registry.apply_remote([eviction]) == [eviction]
    assert registry.get("held") == eviction
    # Compaction frees the allowance.
    clock.now += 1001
    registry.apply_remote([record_for(evictor, "evictor", version=2, updated_at=clock.now)])
    registry.collect_garbage()
    assert len(registry.apply_remote([ending("ghost-late")])) == 1
