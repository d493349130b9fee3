"""What a node advertises: its own addresses, the ones a bootstrap peer could dial back, or relay circuits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentela.errors import PeerUnreachableError
from opentela.fabric.identity import Identity
from opentela.fabric.relay import circuit_addr
from opentela.node._config import Reachability
from opentela.node.reachability import NodeReachability, advertised_addrs

RELAY = Identity.generate().peer_id


class FakeHost:
    def __init__(self, reachable: list[str] | Exception, relay_ok: bool = True) -> None:
        self.reachable = reachable
        self.relay_ok = relay_ok
        self.checked: list[tuple[str, list[str]]] = []

    async def check_reachable(self, peer_id: str, addrs: Sequence[str]) -> list[str]:
        self.checked.append((peer_id, list(addrs)))
        if isinstance(self.reachable, Exception):
            raise self.reachable
        return self.reachable

    async def reserve_relay(self, relay_addr: str) -> str:
        if not self.relay_ok:
            raise PeerUnreachableError(f"no relay at {relay_addr}")
        return RELAY


def reach(mode: Reachability, host: FakeHost) -> tuple[NodeReachability, list[dict[str, Any]]]:
    updates: list[dict[str, Any]] = []
    return NodeReachability(mode, host, ["10.0.0.1:4000"], lambda **kw: updates.append(kw)), updates


def test_configured_addresses_win_and_wildcards_become_concrete() -> None:
    assert advertised_addrs(["0.0.0.0:5"], ("a:1",)) == ("a:1",)
    assert advertised_addrs(["10.1.2.3:7"], ()) == ("10.1.2.3:7",)
    wild = advertised_addrs(["0.0.0.0:7"], ())
    assert "127.0.0.1:7" in wild and wild[-1] == "127.0.0.1:7"  # loopback last: peers try in order


def test_a_private_node_advertises_nothing_until_it_holds_relays() -> None:
    private, _ = reach(Reachability.PRIVATE, FakeHost([]))
    public, _ = reach(Reachability.PUBLIC, FakeHost([]))
    assert private.private and private.initial_addrs(["10.1.2.3:7"], ()) == ()
    assert not public.private and public.initial_addrs(["10.1.2.3:7"], ()) == ("10.1.2.3:7",)


async def test_auto_keeps_only_the_addresses_a_bootstrap_peer_reached() -> None:
    host = FakeHost(["10.1.2.3:7"])
    node, updates = reach(Reachability.AUTO, host)
    await node.settle(["peerA"], ("10.1.2.3:7", "127.0.0.1:7"))
    assert host.checked == [("peerA", ["10.1.2.3:7", "127.0.0.1:7"])]
    assert updates == [{"addrs": ("10.1.2.3:7",)}] and not node.private


async def test_auto_turns_private_and_reserves_relays_when_nothing_gets_through() -> None:
    node, updates = reach(Reachability.AUTO, FakeHost([]))
    await node.settle(["peerA"], ("10.1.2.3:7",))
    relay = f"{RELAY}@10.0.0.1:4000"
    assert node.private and node.relays == (relay,)
    assert updates == [{"addrs": (circuit_addr(relay),), "relays": (relay,)}]


async def test_a_failed_check_tries_the_next_peer_and_public_never_checks() -> None:
    host = FakeHost(PeerUnreachableError("gone"))
    node, updates = reach(Reachability.AUTO, host)
    await node.settle(["peerA", "peerB"], ("10.1.2.3:7",))
    assert [p for p, _ in host.checked] == ["peerA", "peerB"] and updates == [] and not node.private
    public_host = FakeHost([])
    public, _ = reach(Reachability.PUBLIC, public_host)
    await public.settle(["peerA"], ("10.1.2.3:7",))
    assert public_host.checked == []


async def test_a_private_node_without_any_relay_changes_nothing() -> None:
    node, updates = reach(Reachability.PRIVATE, FakeHost([], relay_ok=False))
    await node.settle(["peerA"], ())
    assert updates == [] and node.relays == ()
