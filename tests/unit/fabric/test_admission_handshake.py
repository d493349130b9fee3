"""Closed networks on real hosts: members connect, anyone else is refused inside the handshake, on both sides."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fabric_helpers import FAST, echo, read_all, wait_until

from opentela.errors import AdmissionError
from opentela.fabric import handshake as hs
from opentela.fabric._config import FabricConfig
from opentela.fabric.addresses import parse_addr
from opentela.fabric.admission import Admission
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import JoinToken
from opentela.fabric.relay import circuit_addr
from opentela.fabric.tls import TlsMaterial

NET = Ed25519PrivateKey.generate()
OTHER_NET = Ed25519PrivateKey.generate()

MakeHost = Callable[..., Awaitable[Host]]


def member(identity: Identity, provider: str = "lab", key: Ed25519PrivateKey = NET, **kw: int) -> Admission:
    return Admission.closed(JoinToken.issue(key, provider, **kw), identity)


@pytest.fixture
async def make_host() -> AsyncIterator[MakeHost]:
    """Hosts with a chosen admission policy (a function of their identity), closed after the test."""
    hosts: list[Host] = []

    async def factory(
        policy: Callable[[Identity], Admission] | None = None, config: FabricConfig = FAST
    ) -> Host:
        identity = Identity.generate()
        admission = policy(identity) if policy else Admission.open()
        host = await Host.create(identity, "127.0.0.1:0", config=config, admission=admission)
        host.set_handler("/echo", echo)
        hosts.append(host)
        return host

    yield factory
    await asyncio.gather(*(h.aclose() for h in reversed(hosts)))


async def test_members_connect_both_ways(make_host: MakeHost, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "opentela.fabric.host")
    a, b = await make_host(member), await make_host(member)
    assert "closed network otn_" in caplog.text
    assert await a.connect(b.listen_addrs[0]) == b.peer_id
    stream = await a.open_stream(b.peer_id, "/echo")
    await stream.write(b"hello")
    await stream.write_eof()
    assert await read_all(stream) == b"hello"
    c = await make_host(lambda i: member(i, "lab-c"))
    assert await c.connect(a.listen_addrs[0]) == a.peer_id  # providers differ, the network is the same
    await wait_until(lambda: a.is_connected(c.peer_id))


async def test_open_hosts_say_so(make_host: MakeHost, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "opentela.fabric.host")
    await make_host()
    assert "open network: any peer may join" in caplog.text


async def refused(
    dialer: Host, listener: Host, caplog: pytest.LogCaptureFixture, dialer_says: str, listener_says: str
) -> None:
    """The dial fails with `dialer_says`; the listener logged `listener_says`; nobody registered anyone."""
    caplog.set_level(logging.INFO, "opentela.fabric.host")
    with pytest.raises(AdmissionError, match=dialer_says):
        await dialer.connect(listener.listen_addrs[0])
    await wait_until(lambda: listener.refused_not_member == 1 and dialer.refused_not_member == 1)
    assert re.search(listener_says, caplog.text)
    assert dialer.connected_peers() == [] and listener.connected_peers() == []


async def test_a_peer_without_a_token_cannot_join(
    make_host: MakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    closed, outsider = await make_host(member), await make_host()
    await refused(outsider, closed, caplog, "did not admit us: .* no membership proof", "no membership proof")


async def test_a_member_does_not_join_an_open_peer(
    make_host: MakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    # Both directions check: a member dialing an open node refuses it, and the open node hears why.
    closed, outsider = await make_host(member), await make_host()
    await refused(
        closed, outsider, caplog, "presented no membership proof", "refused us: .* no membership proof"
    )


async def test_an_expired_token_is_refused(make_host: MakeHost, caplog: pytest.LogCaptureFixture) -> None:
    closed = await make_host(member)
    stale = await make_host(lambda i: member(i, expires_at=int(time.time()) - 5))
    await refused(stale, closed, caplog, "did not admit us: the join token of .* expired", "expired at")


async def test_a_token_of_another_network_is_refused(
    make_host: MakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    ours, theirs = await make_host(member), await make_host(lambda i: member(i, key=OTHER_NET))
    # The dialer is the one refusing here: it checks the listener's proof first.
    await refused(
        theirs, ours, caplog, "is a member of network otn_", "refused us: .* is a member of network"
    )


async def test_a_revoked_token_is_refused(make_host: MakeHost, caplog: pytest.LogCaptureFixture) -> None:
    revoked_id: list[bytes] = []

    def victim(identity: Identity) -> Admission:
        adm = member(identity)
        assert adm.own is not None
        revoked_id.append(adm.own.grant.token_id)
        return adm

    dialer = await make_host(victim)
    judge = await make_host(
        lambda i: Admission(member(i).network_id, member(i).own, revoked=frozenset(revoked_id))
    )
    await refused(dialer, judge, caplog, "revoked", "revoked")


async def test_a_proof_copied_from_another_node_is_refused(make_host: MakeHost) -> None:
    server = await make_host(member)
    honest = member(Identity.generate())  # its proof names another node's key
    identity = Identity.generate()
    host, port, _ = parse_addr(server.listen_addrs[0])
    tls = TlsMaterial.create(identity)
    reader, writer = await asyncio.open_connection(host, port, ssl=tls.client_context, server_hostname="")
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        nonce, proof_len = hs.decode_server_hello(await reader.readexactly(hs.SERVER_HELLO.size))
        assert proof_len > 0  # the server showed its own membership
        await reader.readexactly(proof_len)
        writer.write(hs.encode_client_hello(identity, cert, nonce, honest.proof))
        status, length = hs.VERDICT.unpack(await reader.readexactly(hs.VERDICT.size))
        reason = (await reader.readexactly(length)).decode()
        assert status == hs.NOT_ADMITTED and "made for another node" in reason
    finally:
        writer.close()
        await writer.wait_closed()
    assert server.connected_peers() == []


async def test_the_connection_ends_when_the_token_expires(make_host: MakeHost) -> None:
    server = await make_host(member)
    short = await make_host(lambda i: member(i, expires_at=int(time.time()) + 4))
    assert await short.connect(server.listen_addrs[0]) == server.peer_id
    assert server.is_connected(short.peer_id)
    await wait_until(lambda: not server.is_connected(short.peer_id), timeout=20)
    with pytest.raises(AdmissionError, match="expired"):
        await short.connect(server.listen_addrs[0])


async def test_relayed_connections_are_admitted_end_to_end(make_host: MakeHost) -> None:
    relay = await make_host(member)
    private = await make_host(member, config=FabricConfig(relay_serve=False))
    dialer = await make_host(member)
    relay_addr = f"{relay.peer_id}@{relay.listen_addrs[0]}"
    await private.reserve_relay(relay_addr)
    stream = await dialer.open_stream(private.peer_id, "/echo", addrs=[circuit_addr(relay_addr)])
    await stream.write(b"through the relay")
    await stream.write_eof()
    assert await read_all(stream) == b"through the relay"
    assert dialer.connection(private.peer_id).get_extra_info("peername") == ("relay", relay.peer_id)


async def test_a_relay_cannot_carry_a_peer_the_target_refuses(make_host: MakeHost) -> None:
    # The relay admits the dialer, the private node does not (it revoked the dialer's token): the end-to-end
    # handshake through the relay refuses it, and the dialer learns why.
    relay = await make_host(member)
    dialer_token = JoinToken.issue(NET, "lab-d")
    dialer = await make_host(lambda i: Admission.closed(dialer_token, i))

    def strict(identity: Identity) -> Admission:
        return Admission.closed(
            JoinToken.issue(NET, "lab"), identity, revoked=frozenset({dialer_token.grant.token_id})
        )

    private = await make_host(strict, config=FabricConfig(relay_serve=False))
    relay_addr = f"{relay.peer_id}@{relay.listen_addrs[0]}"
    await private.reserve_relay(relay_addr)
    with pytest.raises(AdmissionError, match="revoked"):
        await dialer.open_stream(private.peer_id, "/echo", addrs=[circuit_addr(relay_addr)])
    await wait_until(lambda: private.refused_not_member == 1)
    assert not dialer.is_connected(private.peer_id)
