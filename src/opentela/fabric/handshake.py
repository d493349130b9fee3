"""The identity and admission handshake that runs inside a fresh TLS connection, before any frame.

The TLS server proves its key through TLS itself (its certificate carries the Ed25519 key; the client checks it
against the peer id it expected). The client proves its key inside the encrypted channel. In a closed network
each side also shows its membership proof (fabric/tokens.py) and checks the other's (admission.py):

    server -> client  ServerHello  "OTLA" | version u8 | nonce (32) | proof length u16 | proof
    client -> server  ClientHello  "OTLA" | version u8 | Ed25519 public key (32) | signature (64)
                                   | status u8 | proof length u16 | reason length u16 | proof | reason
    server -> client  Verdict      status u8 (0 = accepted) | reason length u16 | reason (utf-8)

The signature covers DOMAIN | SHA-256(server certificate DER) | nonce, so a proof made for one connection (or
relayed from another server) does not verify on any other. The ClientHello's status is the client's own verdict
on the server's membership: a client that refuses the server says why there, and the server sends no Verdict.
"""

from __future__ import annotations

import os
import struct
from typing import Protocol

from opentela._types import PeerId
from opentela.errors import AdmissionError, HandshakeError
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity, peer_id_from_public_key, verify_signature
from opentela.fabric.join_tokens import Grant
from opentela.fabric.tls import fingerprint, peer_id_from_certificate

MAGIC = b"OTLA"
VERSION = 2
NONCE_SIZE = 32
DOMAIN = b"opentela/handshake/v1\x00"
SERVER_HELLO = struct.Struct(">4sB32sH")
CLIENT_HELLO = struct.Struct(">4sB32s64sBHH")
VERDICT = struct.Struct(">BH")
MAX_REASON = 1024
MAX_PROOF = 1024

ACCEPTED = 0
REJECTED = 1
NOT_ADMITTED = 2

_OPEN = Admission.open()


class HandshakeChannel(Protocol):
    """The raw byte channel a handshake runs over (a connection before it starts multiplexing)."""

    async def recv_exactly(self, n: int) -> bytes: ...

    def send(self, data: bytes) -> None: ...


def proof_payload(certificate: bytes, nonce: bytes) -> bytes:
    """What the client signs: bound to this server's certificate and this connection's nonce."""
    return DOMAIN + fingerprint(certificate) + nonce


def _check_version(magic: bytes, version: int, who: str) -> None:
    if magic != MAGIC:
        raise HandshakeError(f"the {who} does not speak the OpenTela fabric protocol")
    if version != VERSION:
        raise HandshakeError(f"the {who} speaks handshake version {version}, we speak {VERSION}")


def _clip(reason: str) -> bytes:
    return reason.encode()[:MAX_REASON]


def encode_server_hello(nonce: bytes, proof: bytes = b"") -> bytes:
    """The server's first message."""
    return SERVER_HELLO.pack(MAGIC, VERSION, nonce, len(proof)) + proof


def decode_server_hello(raw: bytes) -> tuple[bytes, int]:
    """(nonce, proof length) from a ServerHello's fixed part; HandshakeError if it is not one we speak."""
    magic, version, nonce, proof_len = SERVER_HELLO.unpack(raw)
    _check_version(magic, version, "peer")
    if proof_len > MAX_PROOF:
        raise HandshakeError(f"the peer's membership proof is {proof_len} bytes, over {MAX_PROOF}")
    return nonce, proof_len


def encode_client_hello(
    identity: Identity,
    server_certificate: bytes,
    nonce: bytes,
    proof: bytes = b"",
    *,
    status: int = ACCEPTED,
    reason: str = "",
) -> bytes:
    """The client's proof of identity for this connection, its membership proof and its verdict on the server."""
    signature = identity.sign(proof_payload(server_certificate, nonce))
    raw_reason = _clip(reason)
    head = CLIENT_HELLO.pack(
        MAGIC, VERSION, identity.public_bytes, signature, status, len(proof), len(raw_reason)
    )
    return head + proof + raw_reason


async def read_client_hello(channel: HandshakeChannel) -> tuple[bytes, bytes, int, bytes, str]:
    """(public key, signature, status, proof, reason) of the next ClientHello; a bad one is refused with a Verdict."""
    magic, version, public_key, signature, status, proof_len, reason_len = CLIENT_HELLO.unpack(
        await channel.recv_exactly(CLIENT_HELLO.size)
    )
    try:
        _check_version(magic, version, "client")
        if proof_len > MAX_PROOF or reason_len > MAX_REASON:
            raise HandshakeError("the client's hello is oversized")
    except HandshakeError as exc:
        channel.send(encode_verdict(REJECTED, exc.message))
        raise
    proof = await channel.recv_exactly(proof_len) if proof_len else b""
    reason = (await channel.recv_exactly(reason_len)).decode(errors="replace") if reason_len else ""
    return public_key, signature, status, proof, reason


def verify_client_key(public_key: bytes, signature: bytes, certificate: bytes, nonce: bytes) -> PeerId:
    """The client's peer id if its signature holds for our certificate and nonce; HandshakeError otherwise."""
    peer_id = peer_id_from_public_key(public_key)
    if not verify_signature(peer_id, proof_payload(certificate, nonce), signature):
        raise HandshakeError(f"the identity proof of {peer_id} does not verify for this connection")
    return peer_id


def encode_verdict(status: int, reason: str = "") -> bytes:
    """The server's answer to a ClientHello."""
    raw = _clip(reason)
    return VERDICT.pack(status, len(raw)) + raw


def check_server_certificate(certificate: bytes | None, expected: PeerId | None, local: PeerId) -> PeerId:
    """The server's peer id from its TLS certificate, checked against the one we meant to reach."""
    peer_id = peer_id_from_certificate(certificate)
    if expected is not None and peer_id != expected:
        raise HandshakeError(f"expected peer {expected} but the server's key is {peer_id}")
    if peer_id == local:
        raise HandshakeError("dialed ourselves", self_dial=True)
    return peer_id


async def server_handshake(
    channel: HandshakeChannel, certificate: bytes, local: PeerId, admission: Admission = _OPEN
) -> tuple[PeerId, Grant | None]:
    """Run the server side; the client's verified peer id and grant, or HandshakeError after telling it why."""
    nonce = os.urandom(NONCE_SIZE)
    channel.send(encode_server_hello(nonce, admission.proof))
    public_key, signature, status, proof, reason = await read_client_hello(channel)
    if status != ACCEPTED:
        # The client judged our membership and refused it: nothing more to say to it.
        peer = peer_id_from_public_key(public_key)
        raise AdmissionError(f"peer {peer} refused us: {reason or 'no reason given'}", by_peer=True)
    try:
        peer_id = verify_client_key(public_key, signature, certificate, nonce)
        if peer_id == local:
            raise HandshakeError("a node cannot connect to itself", self_dial=True)
    except HandshakeError as exc:
        channel.send(encode_verdict(REJECTED, exc.message))
        raise
    try:
        grant = admission.check(proof, peer_id)
    except AdmissionError as exc:
        channel.send(encode_verdict(NOT_ADMITTED, exc.message))
        raise
    channel.send(encode_verdict(ACCEPTED))
    return peer_id, grant


async def client_handshake(
    channel: HandshakeChannel,
    identity: Identity,
    server_certificate: bytes,
    admission: Admission = _OPEN,
    server: PeerId | None = None,
) -> Grant | None:
    """Run the client side after the server certificate was checked; the server's grant (None when open).

    Raises AdmissionError when either side finds the other is not a member, HandshakeError for anything else.
    """
    nonce, proof_len = decode_server_hello(await channel.recv_exactly(SERVER_HELLO.size))
    proof = await channel.recv_exactly(proof_len) if proof_len else b""
    server = server or peer_id_from_certificate(server_certificate)
    try:
        grant = admission.check(proof, server)
    except AdmissionError as exc:
        channel.send(
            encode_client_hello(identity, server_certificate, nonce, status=NOT_ADMITTED, reason=exc.message)
        )
        raise
    channel.send(encode_client_hello(identity, server_certificate, nonce, admission.proof))
    status, length = VERDICT.unpack(await channel.recv_exactly(VERDICT.size))
    reason = (await channel.recv_exactly(length)).decode(errors="replace") if length else ""
    if status == NOT_ADMITTED:
        raise AdmissionError(f"peer {server} did not admit us: {reason or 'no reason given'}", by_peer=True)
    if status != ACCEPTED:
        raise HandshakeError(f"the peer refused our identity: {reason or 'no reason given'}")
    return grant
