"""Host behaviour: connection reuse and loss, garbage from a peer, simultaneous dials, bootstrap, shutdown."""

from __future__ import annotations

import asyncio

import pytest
from fabric_helpers import HostFactory, echo, free_port, read_all, wait_until

from opentela._types import Stream
from opentela.errors import ConnectionClosedError, DialTimeout, PeerUnreachableError, StreamResetError
from opentela.fabric._config import FabricConfig
from opentela.fabric.addresses import parse_addr
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity


async def echo_once(a: Host, b: Host, payload: bytes = b"hi") -> bytes:
    stream = await a.open_stream(b.peer_id, "/echo")
    await stream.write(payload)
    await stream.write_eof()
    return await read_all(stream)


async def test_open_stream_dials_the_given_addresses_once(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    bad = f"127.0.0.1:{free_port()}"
    # Many callers at once: one dial (the dead address is skipped), one connection, all streams on it.
    streams = await asyncio.gather(
        *(a.open_stream(b.peer_id, "/echo", addrs=[bad, b.listen_addrs[0]]) for _ in range(20))
    )
    assert len({id(s._link) for s in streams}) == 1 and len(a._live) == 1
    for s in streams:
        s.reset()
    with pytest.raises(PeerUnreachableError):
        await a.open_stream(Identity.generate().peer_id, "/echo")
    with pytest.raises(PeerUnreachableError):
        await a.open_stream(Identity.generate().peer_id, "/echo", addrs=[bad])


async def test_a_stale_address_of_another_node_is_skipped(make_host: HostFactory) -> None:
    a, b, c = await make_host(), await make_host(), await make_host()
    # c now listens where b's record says b was; the key check refuses it and the next address is tried.
    stream = await a.open_stream(b.peer_id, "/echo", addrs=[c.listen_addrs[0], b.listen_addrs[0]])
    assert stream.remote_peer == b.peer_id
    await stream.write(b"right peer")
    await stream.write_eof()
    assert await read_all(stream) == b"right peer"
    assert a.connected_peers() == [b.peer_id]


async def test_connection_callbacks_and_reuse(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    events: list[tuple[str, str]] = []
    a.on_peer_connected(lambda p: events.append(("up", p)))
    a.on_peer_disconnected(lambda p: events.append(("down", p)))
    assert await a.connect(b.listen_addrs[0]) == b.peer_id
    assert await a.connect(b.listen_addrs[0]) == b.peer_id  # reused, no second connection
    assert len(a._live) == 1 and events == [("up", b.peer_id)]
    await b.aclose()
    await wait_until(lambda: events == [("up", b.peer_id), ("down", b.peer_id)])
    assert a.connected_peers() == []


async def test_killed_connection_fails_streams_and_reports_the_peer_gone(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    gone: list[str] = []
    a.on_peer_disconnected(gone.append)
    hold = asyncio.Event()

    async def hang(stream: Stream) -> None:
        await hold.wait()

    b.set_handler("/hang", hang)
    await a.connect(b.listen_addrs[0])
    streams = [await a.open_stream(b.peer_id, "/hang") for _ in range(3)]
    for s in streams:
        await s.write(b"x")
    await wait_until(lambda: b.is_connected(a.peer_id) and b.connection(a.peer_id).stream_count == 3)
    b.connection(a.peer_id)._transport.abort()  # the process died, the cable was pulled
    for s in streams:
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(s.read(), 2)
        with pytest.raises(ConnectionClosedError):
            await s.write(b"y")
    await wait_until(lambda: gone == [b.peer_id])
    # A new stream dials again.
    assert await asyncio.wait_for(echo_once_with_addrs(a, b), 3) == b"back"


async def echo_once_with_addrs(a: Host, b: Host) -> bytes:
    stream = await a.open_stream(b.peer_id, "/echo", addrs=b.listen_addrs)
    await stream.write(b"back")
    await stream.write_eof()
    return await read_all(stream)


async def test_garbled_frames_close_only_that_connection(make_host: HostFactory) -> None:
    server, good, evil = await make_host(), await make_host(), await make_host()
    gone: list[str] = []
    server.on_peer_disconnected(gone.append)
    await good.connect(server.listen_addrs[0])
    await evil.connect(server.listen_addrs[0])
    await wait_until(lambda: len(server.connected_peers()) == 2)
    victim = await evil.open_stream(server.peer_id, "/echo")
    await victim.write(b"x")
    assert await victim.read() == b"x"
    # Bytes that are not a frame, injected under the TLS layer of a valid connection.
    evil.connection(server.peer_id).send(b"\x07garbage-garbage-garbage")
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(victim.read(), 2)
    await wait_until(lambda: gone == [evil.peer_id])
    assert server.connected_peers() == [good.peer_id]
    assert await echo_once(good, server, b"unharmed") == b"unharmed"


async def test_simultaneous_dial_keeps_exactly_one_connection(make_host: HostFactory) -> None:
    for _ in range(3):
        a, b = await make_host(), await make_host()
        down: list[str] = []
        a.on_peer_disconnected(down.append)
        b.on_peer_disconnected(down.append)
        await asyncio.gather(a.connect(b.listen_addrs[0]), b.connect(a.listen_addrs[0]))
        # Streams opened during the race complete on whichever connection they got.
        replies = await asyncio.gather(echo_once(a, b, b"ab"), echo_once(b, a, b"ba"))
        assert replies == [b"ab", b"ba"]
        await wait_until(lambda a=a, b=b: len(a._live) == 1 and len(b._live) == 1)
        conn_a, conn_b = a.connection(b.peer_id), b.connection(a.peer_id)
        assert conn_a.usable and conn_b.usable
        # The same TCP connection on both sides, dialed by the smaller peer id.
        assert conn_a.get_extra_info("sockname") == conn_b.get_extra_info("peername")
        assert (conn_a.initiator if a.peer_id < b.peer_id else conn_b.initiator) is True
        assert down == []
        assert await echo_once(a, b) == b"hi"


async def test_bootstrap_retries_until_a_listener_appears(make_host: HostFactory) -> None:
    a = await make_host()
    port = free_port()
    task = asyncio.create_task(a.bootstrap([f"127.0.0.1:{port}"], initial_delay=0.05, max_delay=0.2))
    await asyncio.sleep(0.4)
    assert not task.done()
    b = await make_host(f"127.0.0.1:{port}")
    assert await asyncio.wait_for(task, 5) == [b.peer_id]
    assert a.is_connected(b.peer_id)


async def test_bootstrap_gives_up_after_the_attempts_and_skips_itself(make_host: HostFactory) -> None:
    a = await make_host()
    with pytest.raises(PeerUnreachableError, match="2 rounds"):
        await a.bootstrap([f"127.0.0.1:{free_port()}"], initial_delay=0.01, attempts=2)
    assert await a.bootstrap([a.listen_addrs[0]], initial_delay=0.01) == []
    assert await a.bootstrap([]) == []
    with pytest.raises(ValueError):
        await a.bootstrap(["not an address"])


async def test_dial_timeout(make_host: HostFactory) -> None:
    a = await make_host()
    # A listener that accepts TCP but never speaks TLS.
    writers: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda r, w: writers.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(DialTimeout):
            await a.connect(f"127.0.0.1:{port}", timeout=0.3)
        # The connection's own handshake deadline, shorter than the dial timeout, is a timeout too.
        impatient = await make_host(config=FabricConfig(handshake_timeout=0.3, dial_timeout=5))
        started = asyncio.get_running_loop().time()
        with pytest.raises(DialTimeout):
            await impatient.connect(f"127.0.0.1:{port}")
        assert asyncio.get_running_loop().time() - started < 2
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_aclose_cancels_handlers_and_refuses_new_work(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever(stream: Stream) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    b.set_handler("/forever", forever)
    stream = await a.open_stream(b.peer_id, "/forever", addrs=b.listen_addrs)
    await stream.write(b"x")
    await asyncio.wait_for(started.wait(), 2)
    await b.aclose()
    assert cancelled.is_set()
    with pytest.raises((StreamResetError, ConnectionClosedError)):
        await asyncio.wait_for(stream.read(), 2)
    with pytest.raises(ConnectionClosedError):
        await b.connect(a.listen_addrs[0])
    host, port, _ = parse_addr(b.listen_addrs[0])
    with pytest.raises(PeerUnreachableError):
        await a.connect(f"{host}:{port}")


def test_the_fabric_runs_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        async with await Host.create(Identity.generate()) as a, await Host.create(Identity.generate()) as b:
            b.set_handler("/echo", echo)
            gone: list[str] = []
            a.on_peer_disconnected(gone.append)
            payloads = [bytes([i]) * (i * 3000) for i in range(40)]
            replies = await asyncio.gather(
                *(echo_once_with(a, b, p) for p in payloads), return_exceptions=False
            )
            assert replies == payloads
            stream = await a.open_stream(b.peer_id, "/missing")
            with pytest.raises(StreamResetError):
                await stream.read()
            b.connection(a.peer_id)._transport.abort()
            await wait_until(lambda: gone == [b.peer_id])

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def echo_once_with(a: Host, b: Host, payload: bytes) -> bytes:
    stream = await a.open_stream(b.peer_id, "/echo", addrs=b.listen_addrs)
    writer = asyncio.ensure_future(write_then_eof(stream, payload))
    reply = await read_all(stream)
    await writer
    return reply


async def write_then_eof(stream: Stream, payload: bytes) -> None:
    await stream.write(payload)
    await stream.write_eof()
