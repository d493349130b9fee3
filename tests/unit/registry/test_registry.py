"""The registry facade: signature checks at the door, views that follow the lifecycle, listeners."""

from __future__ import annotations

import dataclasses

import pytest

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
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
    registry.apply_remote([serving, left])
    assert registry.get(serving.session_id).lifecycle is Lifecycle.LEFT
    assert registry.candidates("m") == []


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
