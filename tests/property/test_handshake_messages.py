"""Handshake messages from a hostile peer: whatever arrives, each side ends in HandshakeError or a verified peer."""

from __future__ import annotations

import asyncio

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import HandshakeError
from opentela.fabric import handshake as hs
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import JoinToken
from opentela.fabric.tls import TlsMaterial

NET = Ed25519PrivateKey.generate()
SERVER, CLIENT = Identity.generate(), Identity.generate()
CERT = TlsMaterial.create(SERVER).certificate
POLICIES = {
    "open": (Admission.open(), Admission.open()),
    "closed": (
        Admission.closed(JoinToken.issue(NET, "s"), SERVER),
        Admission.closed(JoinToken.issue(NET, "c"), CLIENT),
    ),
}


class ScriptedChannel:
    """A handshake channel that delivers fixed bytes, then behaves as a closed connection."""

    def __init__(self, incoming: bytes) -> None:
        self.incoming = bytearray(incoming)
        self.sent = bytearray()

    async def recv_exactly(self, n: int) -> bytes:
        if len(self.incoming) < n:
            raise HandshakeError("connection closed during the handshake")
        out = bytes(self.incoming[:n])
        del self.incoming[:n]
        return out

    def send(self, data: bytes) -> None:
        self.sent += data


def mangled(valid: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes, and the valid message with bytes changed, cut or appended."""
    edits = st.tuples(st.integers(0, max(0, len(valid) - 1)), st.binary(min_size=1, max_size=4))
    return st.one_of(
        st.binary(max_size=400),
        edits.map(lambda e: valid[: e[0]] + e[1] + valid[e[0] + len(e[1]) :]),
        st.integers(0, len(valid)).map(lambda cut: valid[:cut]),
    )


def valid_client_hello(policy: str) -> bytes:
    # The nonce is fresh per connection, so even an untouched hello fails its signature: the server must say so.
    return hs.encode_client_hello(CLIENT, CERT, b"\0" * hs.NONCE_SIZE, POLICIES[policy][1].proof)


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)), data=st.data())
def test_the_server_survives_any_client_hello(policy: str, data: st.DataObject) -> None:
    raw = data.draw(mangled(valid_client_hello(policy)))
    channel = ScriptedChannel(raw)
    try:
        asyncio.run(hs.server_handshake(channel, CERT, SERVER.peer_id, POLICIES[policy][0]))
    except HandshakeError:
        pass
    else:
        raise AssertionError("a hello signed for another nonce was accepted")
    # Whatever it refused, it either said why in a Verdict or had nothing to answer (closed or client refusal).
    if len(channel.sent) > hs.SERVER_HELLO.size + len(POLICIES[policy][0].proof):
        verdict = channel.sent[hs.SERVER_HELLO.size + len(POLICIES[policy][0].proof) :]
        assert verdict[0] in (hs.REJECTED, hs.NOT_ADMITTED)


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)), data=st.data())
def test_the_client_survives_any_server_reply(policy: str, data: st.DataObject) -> None:
    server_adm, client_adm = POLICIES[policy]
    valid = hs.encode_server_hello(b"\1" * hs.NONCE_SIZE, server_adm.proof) + hs.encode_verdict(hs.ACCEPTED)
    raw = data.draw(mangled(valid))
    try:
        grant = asyncio.run(
            hs.client_handshake(ScriptedChannel(raw), CLIENT, CERT, client_adm, SERVER.peer_id)
        )
    except HandshakeError:
        return
    # Accepted: then the server's proof was intact (in a closed network) and the verdict said yes.
    assert (grant is not None) == (policy == "closed")
    if grant is not None:
        assert grant == server_adm.own.grant  # type: ignore[union-attr]
