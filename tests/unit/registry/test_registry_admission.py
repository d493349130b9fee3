"""A closed network's registry: records of non-members are dropped at the door and counted, members pass."""

from __future__ import annotations

import dataclasses
import time

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from opentela._types import Lifecycle
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import JoinToken
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry

NET = Ed25519PrivateKey.generate()
OTHER_NET = Ed25519PrivateKey.generate()


def serving(identity: Identity, provider: str, membership: bytes, session: str = "s1") -> NodeRecord:
    return NodeRecord(
        session_id=session,
        peer_id=identity.peer_id,
        provider_id=provider,
        lifecycle=Lifecycle.SERVING,
        version=1,
        addrs=("127.0.0.1:1",),
        models=(ModelEntry("m"),),
        membership=membership,
    ).signed(identity)


def proof(identity: Identity, provider: str = "lab-b", key: Ed25519PrivateKey = NET, **kw: int) -> bytes:
    return Admission.closed(JoinToken.issue(key, provider, **kw), identity).proof


@pytest.fixture
def registry() -> Registry:
    me = Identity.generate()
    admission = Admission.closed(JoinToken.issue(NET, "lab-a"), me)
    local = NodeRecord(
        session_id="local", peer_id=me.peer_id, provider_id="lab-a", lifecycle=Lifecycle.JOIN, version=1
    )
    return Registry(me, local.signed(me), admission=admission)


def test_the_local_record_carries_our_membership_proof(registry: Registry) -> None:
    assert registry.local.membership == registry.admission.proof and registry.local.verify()
    assert registry.update_local(lifecycle=Lifecycle.SERVING).membership == registry.admission.proof


def test_a_member_record_round_trips_and_enters_the_views(registry: Registry) -> None:
    peer = Identity.generate()
    record = serving(peer, "lab-b", proof(peer))
    wire = msgpack.unpackb(msgpack.packb(record.to_wire(), use_bin_type=True), raw=False)
    assert registry.apply_wire([wire]) == [record]
    assert registry.candidates("m") == [record]
    assert registry.stats().get("rejected_not_member", 0) == 0


@pytest.mark.parametrize(
    "case", ["no proof", "other network", "expired", "other provider", "other node", "evictor"]
)
def test_records_of_non_members_never_reach_a_view(registry: Registry, case: str) -> None:
    peer = Identity.generate()
    if case == "no proof":
        record = serving(peer, "lab-b", b"")
    elif case == "other network":
        record = serving(peer, "lab-b", proof(peer, key=OTHER_NET))
    elif case == "expired":
        record = serving(peer, "lab-b", proof(peer, expires_at=int(time.time()) - 1))
    elif case == "other provider":
        record = serving(peer, "lab-c", proof(peer, "lab-b"))  # a token for lab-b, a record claiming lab-c
    elif case == "other node":
        record = serving(peer, "lab-b", proof(Identity.generate()))  # a member's proof, copied
    else:
        # A valid member's record, evicted (LEFT) by someone who is not a member.
        good = serving(peer, "lab-b", proof(peer))
        registry.apply_remote([good])
        outsider = Identity.generate()
        record = dataclasses.replace(good, lifecycle=Lifecycle.LEFT, version=2, reason="evicted").signed(
            outsider
        )
        assert record.verify()
    before = registry.candidates("m")
    assert registry.apply_remote([record]) == []
    assert registry.candidates("m") == before
    assert registry.stats()["rejected_not_member"] == 1
    assert all(r.signer != record.signer or r.lifecycle is not record.lifecycle for r in registry.records())


def test_an_eviction_by_a_member_is_accepted(registry: Registry) -> None:
    peer, evictor = Identity.generate(), Identity.generate()
    good = serving(peer, "lab-b", proof(peer))
    registry.apply_remote([good, serving(evictor, "lab-c", proof(evictor, "lab-c"), session="s2")])
    left = dataclasses.replace(good, lifecycle=Lifecycle.LEFT, version=2, reason="evicted").signed(evictor)
    assert registry.apply_remote([left]) == [left]
    assert registry.candidates("m") != [] and good not in registry.candidates("m")


def test_an_open_registry_ignores_membership(registry: Registry) -> None:
    me = Identity.generate()
    local = NodeRecord(
        session_id="l", peer_id=me.peer_id, provider_id="x", lifecycle=Lifecycle.JOIN, version=1
    )
    open_registry = Registry(me, local.signed(me))
    assert open_registry.local.membership == b""
    assert "membership" not in open_registry.local.to_wire(), "open-network records keep their old shape"
    peer = Identity.generate()
    assert open_registry.apply_remote([serving(peer, "anyone", b"")]) != []
