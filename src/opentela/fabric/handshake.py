"""The identity handshake that runs inside a fresh TLS connection, before any frame.

The TLS server proves its key through TLS itself (its certificate carries the Ed25519 key; the client checks it
against the peer id it expected). The client proves its key inside the encrypted channel:

    server -> client  ServerHello  "OTLA" | version u8 | nonce (32 random bytes)
    client -> server  ClientHello  "OTLA" | version u8 | Ed25519 public key (32) | signature (64)
    server -> client  Verdict      status u8 (0 = accepted) | reason length u16 | reason (utf-8)

The signature covers DOMAIN | SHA-256(server certificate DER) | nonce, so a proof made for one connection (or
relayed from another server) does not verify on any other.
"""

from __future__ import annotations

import os
import struct
from typing import Protocol

from opentela._types import PeerId
from opentela.errors import HandshakeError
from opentela.fabric.identity import Identity, peer_id_from_public_key, verify_signature
from opentela.fabric.tls import fingerprint, peer_id_from_certificate

MAGIC = b"OTLA"
VERSION = 1
NONCE_SIZE = 32
DOMAIN = b"opentela/handshake/v1\x00"
SERVER_HELLO = struct.Struct(">4sB32s")
CLIENT_HELLO = struct.Struct(">4sB32s64s")
VERDICT = struct.Struct(">BH")
MAX_REASON = 1024

ACCEPTED = 0
REJECTED = 1


class HandshakeChannel(Protocol):
    """The raw byte channel a handshake runs over (a connection before it starts multiplexing)."""

    async def recv_exactly(self, n: int) -> bytes: ...

    def send(self, data: bytes) -> None: ...


def proof_payload(certificate: bytes, nonce: bytes) -> bytes:
    """What the client signs: bound to this server's certificate and this connection's nonce."""
    return DOMAIN + fingerprint(certificate) + nonce


def encode_server_hello(nonce: bytes) -> bytes:
    """The server's first message."""
    return SERVER_HELLO.pack(MAGIC, VERSION, nonce)


def decode_server_hello(raw: bytes) -> bytes:
    """The nonce in a ServerHello; HandshakeError if it is not one we speak."""
    magic, version, nonce = SERVER_HELLO.unpack(raw)
    if magic != MAGIC:
        raise HandshakeError("the peer does not speak the OpenTela fabric protocol")
    if version != VERSION:
        raise HandshakeError(f"the peer speaks handshake version {version}, we speak {VERSION}")
    return nonce


def encode_client_hello(identity: Identity, server_certificate: bytes, nonce: bytes) -> bytes:
    """The client's proof of identity for this connection."""
    signature = identity.sign(proof_payload(server_certificate, nonce))
    return CLIENT_HELLO.pack(MAGIC, VERSION, identity.public_bytes, signature)


def verify_client_hello(raw: bytes, certificate: bytes, nonce: bytes) -> PeerId:
    """The client's peer id if its proof holds for our certificate and nonce; HandshakeError otherwise."""
    magic, version, public_key, signature = CLIENT_HELLO.unpack(raw)
    if magic != MAGIC:
        raise HandshakeError("the client does not speak the OpenTela fabric protocol")
    if version != VERSION:
        raise HandshakeError(f"the client speaks handshake version {version}, we speak {VERSION}")
    peer_id = peer_id_from_public_key(public_key)
    if not verify_signature(peer_id, proof_payload(certificate, nonce), signature):
        raise HandshakeError(f"the identity proof of {peer_id} does not verify for this connection")
    return peer_id


def encode_verdict(status: int, reason: str = "") -> bytes:
    """The server's answer to a ClientHello."""
    raw = reason.encode()[:MAX_REASON]
    return VERDICT.pack(status, len(raw)) + raw


def check_server_certificate(certificate: bytes | None, expected: PeerId | None, local: PeerId) -> PeerId:
    """The server's peer id from its TLS certificate, checked against the one we meant to reach."""
    peer_id = peer_id_from_certificate(certificate)
    if expected is not None and peer_id != expected:
        raise HandshakeError(f"expected peer {expected} but the server's key is {peer_id}")
    if peer_id == local:
        raise HandshakeError("dialed ourselves", self_dial=True)
    return peer_id


async def server_handshake(channel: HandshakeChannel, certificate: bytes, local: PeerId) -> PeerId:
    """Run the server side; the client's verified peer id, or HandshakeError after telling the client why."""
    nonce = os.urandom(NONCE_SIZE)
    channel.send(encode_server_hello(nonce))
    raw = await channel.recv_exactly(CLIENT_HELLO.size)
    try:
        peer_id = verify_client_hello(raw, certificate, nonce)
        if peer_id == local:
            raise HandshakeError("a node cannot connect to itself", self_dial=True)
    except HandshakeError as exc:
        channel.send(encode_verdict(REJECTED, exc.message))
        raise
    channel.send(encode_verdict(ACCEPTED))
    return peer_id


async def client_handshake(channel: HandshakeChannel, identity: Identity, server_certificate: bytes) -> None:
    """Run the client side after the server certificate was checked; HandshakeError if the server refuses."""
    nonce = decode_server_hello(await channel.recv_exactly(SERVER_HELLO.size))
    channel.send(encode_client_hello(identity, server_certificate, nonce))
    status, length = VERDICT.unpack(await channel.recv_exactly(VERDICT.size))
    reason = (await channel.recv_exactly(length)).decode(errors="replace") if length else ""
    if status != ACCEPTED:
        raise HandshakeError(f"the peer refused our identity: {reason or 'no reason given'}")
