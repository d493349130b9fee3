"""The gateway's Mesh contract over a node's registry replica, liveness layer and fabric host."""

from __future__ import annotations

from typing import Any

from opentela._types import PROTO_CONTROL, Lifecycle
from opentela.errors import DialTimeout, EngineCrashedError
from opentela.fabric.identity import Identity
from opentela.node.control import ControlService
from opentela.node.http_service import LocalEngineProxy
from opentela.node.mesh_view import MeshView
from opentela.node.session import join_record
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry

ME, OTHER, SUSPECT = Identity.generate(), Identity.generate(), Identity.generate()


class FakeMembership:
    def __init__(self) -> None:
        self.suspected: set[str] = {SUSPECT.peer_id}

    def is_suspected(self, peer: str) -> bool:
        return peer in self.suspected

    def is_excluded(self, record: NodeRecord) -> bool:
        return record.peer_id in self.suspected

    def suspect(self, peer: str, reason: str) -> None:
        self.suspected.add(peer)

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"peer_id": p} for p in sorted(self.suspected)]

    def stats(self) -> dict[str, Any]:
        return {"suspected": len(self.suspected)}


class FakeRelay:
    def stats(self) -> dict[str, Any]:
        return {"circuits": 0}


class FakeAdmission:
    network_id = ""


class FakeHost:
    listen_addrs = ["127.0.0.1:4000"]
    relay = FakeRelay()
    admission = FakeAdmission()
    refused_not_member = 2

    def __init__(self) -> None:
        self.opened: list[tuple[str, str, tuple[str, ...]]] = []

    async def open_stream(self, peer: str, proto: str, *, addrs: tuple[str, ...], timeout: float) -> str:
        self.opened.append((peer, proto, tuple(addrs)))
        return "stream"


class FakeGossip:
    def stats(self) -> dict[str, Any]:
        return {"rounds": 1}


def serving(identity: Identity, model: str, addr: str) -> NodeRecord:
    first = join_record(identity, identity.peer_id[-6:], "p", addrs=(addr,), roles=("worker",), hardware={})
    return first.next(identity, lifecycle=Lifecycle.SERVING, models=(ModelEntry(id=model, engine="sim"),))


def view() -> tuple[MeshView, FakeHost, list[str]]:
    registry = Registry(
        ME, join_record(ME, "mine", "p", addrs=("10.0.0.9:1",), roles=("worker",), hardware={})
    )
    registry.apply_remote([serving(OTHER, "m", "10.0.0.2:1"), serving(SUSPECT, "m", "10.0.0.3:1")])
    host, spawned = FakeHost(), []
    control = ControlService([], False, lambda: None, lambda a: None)
    mesh = MeshView(
        host,  # type: ignore[arg-type]
        registry,
        FakeMembership(),  # type: ignore[arg-type]
        FakeGossip(),  # type: ignore[arg-type]
        LocalEngineProxy(lambda _model: None, max_body=1024),
        control,
        bootstrap=["10.0.0.2:1"],
        spawn=lambda coro, name: (coro.close(), spawned.append(name)),
    )
    return mesh, host, spawned


def test_reads_leave_out_suspected_replicas() -> None:
    mesh, _, _ = view()
    assert mesh.peer_id == ME.peer_id and mesh.session_id == "mine"
    assert [r.peer_id for r in mesh.candidates("m")] == [OTHER.peer_id]
    assert len(mesh.model_replicas()["m"]) == 2 and mesh.known_model_ids() == {"m"}
    assert mesh.is_suspected(SUSPECT.peer_id) and not mesh.is_suspected(OTHER.peer_id)
    assert {r.peer_id for r in mesh.live_records()} == {ME.peer_id, OTHER.peer_id}
    assert mesh.bootstraps() == {"configured": ["10.0.0.2:1"], "self": [f"{ME.peer_id}@10.0.0.9:1"]}


def test_transport_failures_are_counted_and_only_some_suspect_the_peer() -> None:
    mesh, _, _ = view()
    other = mesh.candidates("m")[0]
    mesh.report_failure(other, EngineCrashedError("boom"))
    assert not mesh.is_suspected(OTHER.peer_id)
    mesh.report_failure(other, DialTimeout("slow"))
    assert mesh.is_suspected(OTHER.peer_id) and mesh.stats()["failures_by_session"] == {other.session_id: 2}


async def test_streams_to_ourselves_stay_in_the_process() -> None:
    mesh, host, spawned = view()
    await mesh.open_http_stream(mesh.registry.local, timeout=1)
    assert spawned == ["local-http"] and host.opened == []
    other = mesh.candidates("m")[0]
    await mesh.open_http_stream(other, timeout=1)
    await mesh.open_control_stream(OTHER.peer_id, timeout=1)
    assert host.opened[1] == (OTHER.peer_id, PROTO_CONTROL, ("10.0.0.2:1",))


def test_stats_and_health_keep_their_keys() -> None:
    mesh, _, _ = view()
    assert set(mesh.stats()) == {
        "registry",
        "gossip",
        "membership",
        "proxy",
        "relay",
        "admission",
        "failures_by_session",
        "control",
        "notices",
    }
    assert (
        mesh.stats()["admission"]["network_id"] == "open" and mesh.stats()["admission"]["refused_peers"] == 2
    )
    health = mesh.health()
    assert health["status"] == "ok" and health["state"] == "JOIN" and health["nodes_known"] == 3


def test_notices_travel_with_health_and_stats_and_peers_are_counted() -> None:
    mesh, _, _ = view()
    assert mesh.health()["notices"] == [] and mesh.peer_count() == 1  # OTHER; SUSPECT is excluded
    mesh.notices.post("no_peers", "start a provider")
    assert [n["code"] for n in mesh.health()["notices"]] == ["no_peers"]
    assert mesh.stats()["notices"][0]["message"] == "start a provider"
