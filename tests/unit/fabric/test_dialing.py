"""Dialing a peer with several addresses: a refused one fails fast, a silent one is raced past after the stagger."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from opentela._types import Stream
from opentela.errors import PeerUnreachableError
from opentela.fabric import dialing
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def echo(stream: Stream) -> None:
    await stream.write(await stream.read(100))
    await stream.write_eof()


async def test_the_dial_moves_past_a_refused_and_a_silent_address() -> None:
    target = await Host.create(Identity.generate(), "127.0.0.1:0")
    dialer = await Host.create(Identity.generate(), "127.0.0.1:0")
    # Accepts TCP (the kernel completes the handshake from its backlog) and never answers TLS.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    target.set_handler("/test/echo/1", echo)
    try:
        addrs = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{silent.getsockname()[1]}", target.listen_addrs[0]]
        started = time.monotonic()
        stream = await dialer.open_stream(target.peer_id, "/test/echo/1", addrs=addrs, timeout=5)
        took = time.monotonic() - started
        await stream.write(b"ping")
        await stream.write_eof()
        assert await stream.read(100) == b"ping"
        # The refused address starts the silent one at once; the real one waits out one stagger behind it.
        assert dialing.STAGGER <= took < 2 * dialing.STAGGER + 1.0
        assert dialer.is_connected(target.peer_id)
    finally:
        silent.close()
        await dialer.aclose()
        await target.aclose()


async def test_every_address_refused_names_them_all() -> None:
    dialer = await Host.create(Identity.generate(), "127.0.0.1:0")
    ports = [closed_port(), closed_port()]
    try:
        peer = Identity.generate().peer_id
        with pytest.raises(PeerUnreachableError) as caught:
            await dialer.open_stream(peer, "/test/echo/1", addrs=[f"127.0.0.1:{p}" for p in ports], timeout=5)
        assert all(str(p) in str(caught.value) for p in ports)
    finally:
        await dialer.aclose()


async def test_a_cancelled_race_leaves_its_untried_addresses() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    host = await Host.create(Identity.generate(), "127.0.0.1:0")
    try:
        targets: list[dialing.Target] = [("127.0.0.1", silent.getsockname()[1], None)]
        errors: list[BaseException] = []
        task = asyncio.create_task(dialing.race(lambda: host._new_conn(initiator=True), targets, errors))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert targets == [("127.0.0.1", silent.getsockname()[1], None)] and errors == []
    finally:
        silent.close()
        await host.aclose()
