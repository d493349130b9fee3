"""Connection limits between real hosts on loopback: trimming to the watermarks, what is spared, reconnecting."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from opentela._types import Stream
from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from stream_kit import echo, read_all, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

SPOKE = FabricConfig(dial_timeout=2.0, handshake_timeout=2.0, keepalive_interval=5.0, keepalive_timeout=2.0)
# Idle closing off: only the watermarks close anything, at once when a newcomer crosses the high one.
HUB = dataclasses.replace(SPOKE, conn_low_water=2, conn_high_water=3, conn_grace=0, conn_idle_timeout=0)

MakeHost = Callable[[FabricConfig], Awaitable[Host]]


async def echo_through(spoke: Host, hub: Host, payload: bytes) -> bytes:
    """Open a stream to `hub` (dialing it if need be), send `payload` and read the echo."""
    stream = await spoke.open_stream(hub.peer_id, "/echo", addrs=hub.listen_addrs)
    await stream.write(payload)
    await stream.write_eof()
    return await read_all(stream)


@pytest.fixture
async def make_host() -> AsyncIterator[MakeHost]:
    hosts: list[Host] = []

    async def factory(config: FabricConfig) -> Host:
        host = await Host.create(Identity.generate(), "127.0.0.1:0", config=config)
        host.set_handler("/echo", echo)
        hosts.append(host)
        return host

    yield factory
    for host in hosts:
        await host.aclose()


async def test_a_crowded_host_trims_to_its_watermarks_and_trimmed_peers_come_back(
    make_host: MakeHost,
) -> None:
    hub = await make_host(HUB)
    release = asyncio.Event()

    async def slow_echo(stream: Stream) -> None:
        body = await read_all(stream)
        await release.wait()
        await stream.write(body)
        await stream.write_eof()

    hub.set_handler("/slow", slow_echo)
    keep, busy, *others = [await make_host(SPOKE) for _ in range(6)]
    hub.connections.protect(keep.peer_id, "test")  # before it ever connects
    await keep.connect(hub.listen_addrs[0])
    payload = os.urandom(300_000)  # more than a window: flow control runs while the trims happen
    in_flight = await busy.open_stream(hub.peer_id, "/slow", addrs=hub.listen_addrs)
    await in_flight.write(payload)
    await in_flight.write_eof()
    await wait_until(lambda: (c := hub.connection(busy.peer_id)) is not None and c.stream_count == 1)

    for spoke in others:
        await spoke.connect(hub.listen_addrs[0])
        await wait_until(lambda: hub.connections.stats()["open"] <= HUB.conn_high_water)
    # Two newcomers crossed the high watermark; each time both idle ones went, down to the low watermark.
    await wait_until(lambda: not any(s.is_connected(hub.peer_id) for s in others))
    assert set(hub.connected_peers()) == {keep.peer_id, busy.peer_id}
    assert keep.is_connected(hub.peer_id) and busy.is_connected(hub.peer_id)
    release.set()
    assert await read_all(in_flight) == payload
    assert hub.connections.stats() == {
        "open": 2,
        "protected": 1,
        "low_water": 2,
        "high_water": 3,
        "peak": 4,
        "trimmed": 4,
        "idle_closed": 0,
        "over_high": 0,
    }

    # Each trimmed peer dials again and is served; every second one crosses the watermark and the two longest
    # idle (the finished stream's peer, then the previous newcomer) go, never the newcomer itself.
    lost: list[str] = []
    for spoke in [busy, *others]:
        spoke.on_peer_disconnected(lost.append)
    for spoke in others:
        assert await echo_through(spoke, hub, spoke.peer_id.encode() * 1000) == spoke.peer_id.encode() * 1000
        await wait_until(lambda: hub.connections.stats()["open"] <= HUB.conn_high_water)
    assert set(hub.connected_peers()) == {keep.peer_id, others[-1].peer_id}
    await wait_until(lambda: len(lost) == 4)
    assert lost == [hub.peer_id] * 4 and keep.is_connected(hub.peer_id)
    stats = hub.connections.stats()
    assert (stats["open"], stats["trimmed"], stats["peak"], stats["over_high"]) == (2, 8, 4, 0)


async def test_idle_connections_close_unless_protected_or_busy(make_host: MakeHost) -> None:
    hub = await make_host(
        dataclasses.replace(HUB, conn_low_water=4, conn_high_water=8, conn_idle_timeout=0.2)
    )
    hold = asyncio.Event()

    async def hang(stream: Stream) -> None:
        await hold.wait()

    hub.set_handler("/hang", hang)
    guarded, busy, idle = [await make_host(SPOKE) for _ in range(3)]
    hub.connections.protect(guarded.peer_id, "serving")
    await guarded.connect(hub.listen_addrs[0])
    stream = await busy.open_stream(hub.peer_id, "/hang", addrs=hub.listen_addrs)
    await stream.write(b"x")
    await idle.connect(hub.listen_addrs[0])  # connected last: had protection failed, `guarded` went first
    await wait_until(lambda: not idle.is_connected(hub.peer_id))
    assert set(hub.connected_peers()) == {guarded.peer_id, busy.peer_id}
    assert hub.connections.stats()["idle_closed"] == 1 and hub.connections.stats()["trimmed"] == 0
    hold.set()
    stream.reset()
    # The busy peer's stream ended: it is idle from now on and goes the same way; the protected one stays.
    await wait_until(lambda: not busy.is_connected(hub.peer_id))
    assert hub.connected_peers() == [guarded.peer_id] and hub.connections.stats()["idle_closed"] == 2
    hub.connections.unprotect(guarded.peer_id, "serving")
    await wait_until(lambda: not guarded.is_connected(hub.peer_id))
    assert hub.connections.stats()["open"] == 0 and hub.connections.stats()["idle_closed"] == 3


async def test_bootstrap_peers_and_relays_are_protected(make_host: MakeHost) -> None:
    relay, private = await make_host(SPOKE), await make_host(dataclasses.replace(SPOKE, relay_serve=False))
    assert await private.bootstrap([relay.listen_addrs[0]], attempts=1) == [relay.peer_id]
    assert private.connections.ledger.tags(relay.peer_id) == {"bootstrap"}
    await private.reserve_relay(f"{relay.peer_id}@{relay.listen_addrs[0]}")
    assert private.connections.ledger.tags(relay.peer_id) == {"bootstrap", "relay"}
    assert relay.connections.ledger.tags(private.peer_id) == {"relay"}  # its only way in
    await private.aclose()
    await wait_until(lambda: not relay.connections.is_protected(private.peer_id))
    assert relay.connections.stats()["open"] == 0
