"""The gateway's Mesh contract over a node's registry replica, liveness layer and fabric host."""

from __future__ import annotations

from typing import Any

from opentela._types import PROTO_CONTROL, Lifecycle
from opentela.errors import DialTimeout, EngineCrashedError
from opentela.fabric._config import FabricConfig
from opentela.fabric.connection_manager import SERVING, ConnectionManager
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


class FakeConnections:
    def stats(self) -> dict[str, int]:
        return {"open": 1}


class FakeAdmission:
    network_id = ""


class FakeHost:
    listen_addrs = ["127.0.0.1:4000"]
    relay = FakeRelay()
    connections = FakeConnections()
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


def serving(identity: Identity, model: str, addr: str, session: str = "") -> NodeRecord:
    session = session or identity.peer_id[-6:]
    first = join_record(identity, session, "p", addrs=(addr,), roles=("worker",), hardware={})
    return first.next(identity, lifecycle=Lifecycle.SERVING, models=(ModelEntry(id=model, engine="sim"),))


def view(role: str = "worker", host: FakeHost | None = None) -> tuple[MeshView, FakeHost, list[str]]:
    registry = Registry(ME, join_record(ME, "mine", "p", addrs=("10.0.0.9:1",), roles=(role,), hardware={}))
    registry.apply_remote([serving(OTHER, "m", "10.0.0.2:1"), serving(SUSPECT, "m", "10.0.0.3:1")])
    host, spawned = host or FakeHost(), []
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
        "view",
        "proxy",
        "fabric",
        "relay",
        "admission",
        "failures_by_session",
        "control",
        "notices",
    }
    assert (
        mesh.stats()["admission"]["network_id"] == "open" and mesh.stats()["admission"]["refused_peers"] == 2
    )
    assert mesh.stats()["fabric"] == {"connections": {"open": 1}}
    health = mesh.health()
    assert health["status"] == "ok" and health["state"] == "JOIN" and health["nodes_known"] == 3


def test_notices_travel_with_health_and_stats_and_peers_are_counted() -> None:
    mesh, _, _ = view()
    assert mesh.health()["notices"] == [] and mesh.peer_count() == 1  # OTHER; SUSPECT is excluded
    mesh.notices.post("no_peers", "start a provider")
    assert [n["code"] for n in mesh.health()["notices"]] == ["no_peers"]
    assert mesh.stats()["notices"][0]["message"] == "start a provider"


def host_with_limits() -> tuple[FakeHost, ConnectionManager]:
    host, connections = FakeHost(), ConnectionManager(FabricConfig())
    host.connections = connections  # type: ignore[assignment]
    return host, connections


async def test_an_ingress_keeps_the_connections_to_its_serving_replicas() -> None:
    host, connections = host_with_limits()
    mesh, _, _ = view("ingress", host)
    # Replicas already in the registry, suspected ones too (suspicion is not a verdict); never ourselves.
    assert connections.ledger.tags(OTHER.peer_id) == {SERVING} and connections.is_protected(SUSPECT.peer_id)
    assert not connections.is_protected(ME.peer_id)
    newcomer = Identity.generate()
    mesh.registry.apply_remote([serving(newcomer, "m", "10.0.0.4:1")])
    assert connections.is_protected(newcomer.peer_id)

    other = mesh.registry.candidates("m")[0]
    assert other.peer_id == OTHER.peer_id
    mesh.registry.apply_remote([other.next(OTHER, lifecycle=Lifecycle.DOWN)])
    assert not connections.is_protected(OTHER.peer_id)
    suspect = next(r for r in mesh.registry.candidates("m") if r.peer_id == SUSPECT.peer_id)
    mesh.registry.evict(suspect.session_id, "unreachable")  # LEFT
    assert not connections.is_protected(SUSPECT.peer_id)
    # Protection (the tag is the peer's) holds while any session of the peer still serves.
    restarted = serving(newcomer, "m", "10.0.0.4:1", session="second")
    mesh.registry.apply_remote([restarted])
    old = next(r for r in mesh.registry.candidates("m") if r.session_id != restarted.session_id)
    mesh.registry.evict(old.session_id, "restarted")
    assert connections.is_protected(newcomer.peer_id)
    connections.close()


async def test_a_worker_protects_no_replica() -> None:
    host, connections = host_with_limits()
    mesh, _, _ = view("worker", host)
    newcomer = Identity.generate()
    mesh.registry.apply_remote([serving(newcomer, "m", "10.0.0.4:1")])
    assert not any(connections.is_protected(p.peer_id) for p in (OTHER, SUSPECT, newcomer))
    connections.close()
