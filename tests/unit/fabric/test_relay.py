"""Circuit relay between real hosts on loopback: a peer reached only through a relay, end-to-end encrypted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from opentela.errors import PeerUnreachableError
from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.relay import circuit_addr


@pytest_asyncio.fixture
async def trio() -> AsyncIterator[tuple[Host, Host, Host]]:
    relay = await Host.create(Identity.generate(), "127.0.0.1:0")
    private = await Host.create(Identity.generate(), "127.0.0.1:0", config=FabricConfig(relay_serve=False))
    dialer = await Host.create(Identity.generate(), "127.0.0.1:0")
    try:
        yield relay, private, dialer
    finally:
        await asyncio.gather(dialer.aclose(), private.aclose(), relay.aclose())


async def echo(stream) -> None:
    while data := await stream.read():
        await stream.write(data)
    await stream.write_eof()


async def test_dial_through_a_relay_reaches_the_private_peer(trio: tuple[Host, Host, Host]) -> None:
    relay, private, dialer = trio
    private.set_handler("/test/echo", echo)
    relay_addr = f"{relay.peer_id}@{relay.listen_addrs[0]}"
    assert await private.reserve_relay(relay_addr) == relay.peer_id
    assert private.peer_id in relay.relay.reservations

    stream = await dialer.open_stream(private.peer_id, "/test/echo", addrs=[circuit_addr(relay_addr)])
    payload = bytes(range(256)) * 2000  # 512 KB: flow control works across the splice
    await stream.write(payload)
    await stream.write_eof()
    got = bytearray()
    while chunk := await stream.read():
        got += chunk
    assert bytes(got) == payload
    conn = dialer.connection(private.peer_id)
    assert conn is not None and conn.get_extra_info("peername") == ("relay", relay.peer_id)
    assert relay.relay.stats()["circuits"] == 1
    assert private.relay.stats()["relayed_in"] == 1


async def test_no_reservation_means_no_circuit(trio: tuple[Host, Host, Host]) -> None:
    relay, private, dialer = trio
    relay_addr = f"{relay.peer_id}@{relay.listen_addrs[0]}"
    with pytest.raises(PeerUnreachableError, match="no relay could reach"):
        await dialer.open_stream(private.peer_id, "/test/echo", addrs=[circuit_addr(relay_addr)], timeout=3)


async def test_a_private_node_refuses_to_relay(trio: tuple[Host, Host, Host]) -> None:
    _, private, dialer = trio
    with pytest.raises(PeerUnreachableError, match="not a relay"):
        await dialer.reserve_relay(f"{private.peer_id}@{private.listen_addrs[0]}")


async def test_direct_address_is_preferred_and_relay_is_the_fallback(trio: tuple[Host, Host, Host]) -> None:
    relay, private, dialer = trio
    private.set_handler("/test/echo", echo)
    relay_addr = f"{relay.peer_id}@{relay.listen_addrs[0]}"
    await private.reserve_relay(relay_addr)
    dead = "127.0.0.1:9"  # nothing listens there: the direct dial fails, the circuit works
    stream = await dialer.open_stream(private.peer_id, "/test/echo", addrs=[dead, circuit_addr(relay_addr)])
    await stream.write(b"abc")
    await stream.write_eof()
    assert await stream.read() == b"abc"


async def test_dial_back_tells_which_addresses_accept_connections(trio: tuple[Host, Host, Host]) -> None:
    relay, _, dialer = trio
    await dialer.connect(relay.listen_addrs[0])
    closed = "127.0.0.1:9"
    reachable = await dialer.check_reachable(
        relay.peer_id, [dialer.listen_addrs[0], closed, "not-an-address"]
    )
    assert reachable == [dialer.listen_addrs[0]]
