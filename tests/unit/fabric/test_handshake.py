"""The identity handshake: both sides learn verified peer ids; wrong keys and bad proofs are refused."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable

import pytest
from fabric_helpers import FAST, HostFactory, free_port, read_all, wait_until

from opentela.errors import HandshakeError, PeerUnreachableError
from opentela.fabric import handshake as hs
from opentela.fabric._config import FabricConfig
from opentela.fabric.addresses import parse_addr
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.tls import TlsMaterial

MakeHello = Callable[[Identity, bytes, bytes], bytes]


async def test_both_sides_learn_each_others_peer_id(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    assert await a.connect(b.listen_addrs[0]) == b.peer_id
    await wait_until(lambda: b.is_connected(a.peer_id))
    assert a.connected_peers() == [b.peer_id] and b.connected_peers() == [a.peer_id]
    # Either side can open streams on the one connection.
    for src, dst in ((a, b), (b, a)):
        stream = await src.open_stream(dst.peer_id, "/echo")
        assert stream.remote_peer == dst.peer_id
        await stream.write(b"ping")
        await stream.write_eof()
        assert await read_all(stream) == b"ping"
    assert a.connection(b.peer_id).get_extra_info("ssl_object").version() == "TLSv1.3"


async def test_peer_id_in_the_address_is_checked(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    host, port, _ = parse_addr(b.listen_addrs[0])
    assert await a.connect(f"{b.peer_id}@{host}:{port}") == b.peer_id
    assert await a.connect(f"/ip4/{host}/tcp/{port}/p2p/{b.peer_id}") == b.peer_id


async def test_server_with_an_unexpected_key_is_refused(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    other = Identity.generate().peer_id
    with pytest.raises(HandshakeError, match="expected peer"):
        await a.connect(b.listen_addrs[0], peer_id=other)
    host, port, _ = parse_addr(b.listen_addrs[0])
    with pytest.raises(HandshakeError):
        await a.open_stream(other, "/echo", addrs=[f"{host}:{port}"])
    await asyncio.sleep(0.05)
    assert a.connected_peers() == [] and b.connected_peers() == []


async def test_dialing_ourselves_is_refused(make_host: HostFactory) -> None:
    a = await make_host()
    with pytest.raises(HandshakeError, match="ourselves") as info:
        await a.connect(a.listen_addrs[0])
    assert info.value.details.get("self_dial")
    assert a.connected_peers() == []


def good_hello(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    return hs.encode_client_hello(identity, cert, nonce)


def wrong_fingerprint(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    sig = identity.sign(hs.DOMAIN + hashlib.sha256(b"some other certificate").digest() + nonce)
    return hs.CLIENT_HELLO.pack(hs.MAGIC, hs.VERSION, identity.public_bytes, sig, hs.ACCEPTED, 0, 0)


def wrong_nonce(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    return hs.encode_client_hello(identity, cert, os.urandom(hs.NONCE_SIZE))


def relayed_proof(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    # A proof the client made for a different server (a relay replaying it here) names the wrong certificate.
    other_cert = TlsMaterial.create(Identity.generate()).certificate
    return hs.encode_client_hello(identity, other_cert, nonce)


def someone_elses_key(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    victim = Identity.generate()
    sig = identity.sign(hs.proof_payload(cert, nonce))
    return hs.CLIENT_HELLO.pack(hs.MAGIC, hs.VERSION, victim.public_bytes, sig, hs.ACCEPTED, 0, 0)


def future_version(identity: Identity, cert: bytes, nonce: bytes) -> bytes:
    sig = identity.sign(hs.proof_payload(cert, nonce))
    return hs.CLIENT_HELLO.pack(hs.MAGIC, hs.VERSION + 1, identity.public_bytes, sig, hs.ACCEPTED, 0, 0)


async def raw_handshake(server: Host, make_hello: MakeHello) -> tuple[int, str]:
    """Speak the handshake by hand; the server's verdict, after checking that it then hangs up on refusal."""
    identity = Identity.generate()
    host, port, _ = parse_addr(server.listen_addrs[0])
    tls = TlsMaterial.create(identity)
    reader, writer = await asyncio.open_connection(host, port, ssl=tls.client_context, server_hostname="")
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        nonce, proof_len = hs.decode_server_hello(await reader.readexactly(hs.SERVER_HELLO.size))
        await reader.readexactly(proof_len)
        writer.write(make_hello(identity, cert, nonce))
        status, length = hs.VERDICT.unpack(await reader.readexactly(hs.VERDICT.size))
        reason = (await reader.readexactly(length)).decode()
        if status != hs.ACCEPTED:
            async with asyncio.timeout(2):
                assert await reader.read() == b""
        return status, reason
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_hand_made_correct_proof_is_accepted(make_host: HostFactory) -> None:
    b = await make_host()
    assert await raw_handshake(b, good_hello) == (hs.ACCEPTED, "")


@pytest.mark.parametrize(
    ("make_hello", "needle"),
    [
        (wrong_fingerprint, "does not verify"),
        (wrong_nonce, "does not verify"),
        (relayed_proof, "does not verify"),
        (someone_elses_key, "does not verify"),
        (future_version, "version"),
    ],
)
async def test_bad_client_proofs_are_refused(
    make_host: HostFactory, make_hello: MakeHello, needle: str
) -> None:
    a, b = await make_host(), await make_host()
    status, reason = await raw_handshake(b, make_hello)
    assert status == hs.REJECTED and needle in reason
    assert b.connected_peers() == []
    # The server is unharmed and keeps accepting honest peers.
    assert await a.connect(b.listen_addrs[0]) == b.peer_id


async def test_silent_client_is_dropped_after_the_handshake_timeout(make_host: HostFactory) -> None:
    b = await make_host(config=FabricConfig(handshake_timeout=0.3))
    host, port, _ = parse_addr(b.listen_addrs[0])
    tls = TlsMaterial.create(Identity.generate())
    reader, writer = await asyncio.open_connection(host, port, ssl=tls.client_context, server_hostname="")
    try:
        await reader.readexactly(hs.SERVER_HELLO.size)
        async with asyncio.timeout(3):
            assert await reader.read() == b""
    finally:
        writer.close()
        await writer.wait_closed()
    assert b.connected_peers() == []


async def test_plain_tcp_garbage_does_not_hurt_the_listener(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host(config=FAST)
    host, port, _ = parse_addr(b.listen_addrs[0])
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n" * 10)
    async with asyncio.timeout(3):
        await reader.read()
    writer.close()
    await writer.wait_closed()
    assert await a.connect(b.listen_addrs[0]) == b.peer_id


async def test_unreachable_address(make_host: HostFactory) -> None:
    a = await make_host()
    with pytest.raises(PeerUnreachableError):
        await a.connect(f"127.0.0.1:{free_port()}")
