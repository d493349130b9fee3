"""Closed-network credentials: the network key, the join tokens it signs and the membership proofs nodes show.

A closed network is named by its Ed25519 *network key*. The operator issues a *join token* per provider: a grant
signed by the network key (network, provider id, a fresh provider key, issue and expiry times, a token id) plus
that provider key's private half. A node never shows its token to anyone. It shows a *membership proof* instead:
the grant plus a signature by the provider key over the node's own public key. A peer that sees the proof can check
everything with the network id alone, and cannot reuse it: the proof names one node key, and the handshake makes
each side prove it holds its key. Wire formats: docs/protocol.md, section 8. Policy: admission.py.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from opentela.errors import ConfigError
from opentela.fabric.identity import Identity, _b58decode, _b58encode

NETWORK_PREFIX = "otn_"
TOKEN_PREFIX = "otjoin1_"
GRANT_VERSION = 1
GRANT_DOMAIN = b"opentela/grant/v1\x00"
MEMBER_DOMAIN = b"opentela/member/v1\x00"
TOKEN_ID_SIZE = 16
MAX_PROVIDER_ID = 255
# version u8 | network key 32 | provider key 32 | issued u64 | expires u64 (0 = never) | token id 16 | id length u8
_HEAD = struct.Struct(">B32s32sQQ16sB")
_SIG = 64
_KEY = 32


def network_id_of(public_key: bytes) -> str:
    """The printable id of a network: its public key, base58, behind a prefix (self-certifying, like peer ids)."""
    return NETWORK_PREFIX + _b58encode(public_key)


def network_key_of(network_id: str) -> bytes:
    """The network public key a network id names; ValueError if it is not one."""
    if not network_id.startswith(NETWORK_PREFIX):
        raise ValueError(f"not a network id (expected {NETWORK_PREFIX}...): {network_id!r}")
    raw = _b58decode(network_id[len(NETWORK_PREFIX) :])
    if len(raw) != _KEY or network_id_of(raw) != network_id:
        raise ValueError(f"not a network id: {network_id!r}")
    return raw


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _verify(public_key: bytes, signature: bytes, data: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (ValueError, InvalidSignature):
        return False
    return True


# --- the network key ----------------------------------------------------------------------------------------
def create_network_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """A new network key written to `path` (mode 0600); refuses to overwrite an existing file."""
    path = Path(path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; a network key is never overwritten") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return key


def load_network_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The network key stored at `path`."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read a network key from {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path} does not hold an Ed25519 network key")
    return key


# --- grants, tokens, proofs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """What the network key signs: this provider (and whoever holds its provider key) may join until `expires_at`."""

    network_key: bytes
    provider_key: bytes
    provider_id: str
    issued_at: int
    expires_at: int  # unix seconds; 0 = never
    token_id: bytes
    signature: bytes = b""

    @property
    def network_id(self) -> str:
        """The network this grant admits to."""
        return network_id_of(self.network_key)

    def body(self) -> bytes:
        """The signed bytes (everything but the signature)."""
        raw = self.provider_id.encode()
        head = _HEAD.pack(
            GRANT_VERSION,
            self.network_key,
            self.provider_key,
            self.issued_at,
            self.expires_at,
            self.token_id,
            len(raw),
        )
        return head + raw

    def encode(self) -> bytes:
        """Wire form: body then the network signature."""
        return self.body() + self.signature

    @classmethod
    def decode_prefix(cls, data: bytes) -> tuple[Grant, int]:
        """Parse a grant at the start of `data`; the grant and its length. ValueError if malformed."""
        if len(data) < _HEAD.size:
            raise ValueError("truncated grant")
        version, network, provider, issued, expires, token_id, length = _HEAD.unpack_from(data)
        if version != GRANT_VERSION:
            raise ValueError(f"grant version {version}, we read {GRANT_VERSION}")
        end = _HEAD.size + length + _SIG
        if length == 0 or len(data) < end:
            raise ValueError("truncated grant")
        try:
            provider_id = data[_HEAD.size : _HEAD.size + length].decode()
        except UnicodeDecodeError:
            raise ValueError("grant provider id is not utf-8") from None
        grant = cls(network, provider, provider_id, issued, expires, token_id, data[end - _SIG : end])
        return grant, end

    def verify(self) -> bool:
        """True when the network key signed this grant."""
        return _verify(self.network_key, self.signature, GRANT_DOMAIN + self.body())

    def expired(self, now: float | None = None) -> bool:
        """Whether the grant has run out."""
        return self.expires_at != 0 and (time.time() if now is None else now) >= self.expires_at

    def describe(self) -> dict[str, object]:
        """JSON-ready claims (for `otela network show-token` and logs)."""
        return {
            "network_id": self.network_id,
            "provider_id": self.provider_id,
            "token_id": self.token_id.hex(),
            "issued_at": iso_time(self.issued_at),
            "expires_at": iso_time(self.expires_at) if self.expires_at else "never",
            "expired": self.expired(),
        }


def iso_time(ts: int) -> str:
    """A unix time as ISO 8601 UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass(frozen=True)
class MembershipProof:
    """Grant + the provider key's signature over one node's public key: what a member shows its peers."""

    grant: Grant
    node_signature: bytes

    def encode(self) -> bytes:
        """Wire form: grant then the node signature."""
        return self.grant.encode() + self.node_signature

    @classmethod
    def decode(cls, data: bytes) -> MembershipProof:
        """Parse (not verify) a proof; ValueError if malformed."""
        grant, end = Grant.decode_prefix(data)
        if len(data) != end + _SIG:
            raise ValueError("a membership proof is a grant and one signature")
        return cls(grant, data[end:])

    def binds(self, node_public_key: bytes) -> bool:
        """True when the provider key vouched for this node key."""
        return _verify(
            self.grant.provider_key, self.node_signature, _member_payload(self.grant, node_public_key)
        )


def _member_payload(grant: Grant, node_public_key: bytes) -> bytes:
    return MEMBER_DOMAIN + grant.network_key + node_public_key


@dataclass(frozen=True)
class JoinToken:
    """A grant and the provider private key: the bearer secret an operator hands to a provider's nodes."""

    grant: Grant
    provider_secret: bytes = field(repr=False)

    @classmethod
    def issue(
        cls,
        network_key: Ed25519PrivateKey,
        provider_id: str,
        *,
        expires_at: int = 0,
        now: float | None = None,
    ) -> JoinToken:
        """A new token for `provider_id`, signed by the network key; `expires_at` 0 never expires."""
        raw = provider_id.encode()
        if not 0 < len(raw) <= MAX_PROVIDER_ID:
            raise ConfigError(f"a provider id has 1..{MAX_PROVIDER_ID} bytes")
        provider = Ed25519PrivateKey.generate()
        unsigned = Grant(
            network_key=_raw_public(network_key),
            provider_key=_raw_public(provider),
            provider_id=provider_id,
            issued_at=int(time.time() if now is None else now),
            expires_at=expires_at,
            token_id=os.urandom(TOKEN_ID_SIZE),
        )
        grant = dataclasses.replace(unsigned, signature=network_key.sign(GRANT_DOMAIN + unsigned.body()))
        secret = provider.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return cls(grant, secret)

    def encode(self) -> str:
        """Printable form: prefix + base64url (no padding) of grant | provider secret."""
        raw = self.grant.encode() + self.provider_secret
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @classmethod
    def decode(cls, text: str) -> JoinToken:
        """Parse and verify a token (signature and key pair, not expiry); ValueError with the reason."""
        text = text.strip()
        if not text.startswith(TOKEN_PREFIX):
            raise ValueError(f"not a join token (expected {TOKEN_PREFIX}...)")
        body = text[len(TOKEN_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise ValueError("join token is not valid base64url") from None
        token_text = TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        if token_text != text:
            raise ValueError("join token is not in canonical form")  # one token, one spelling
        grant, end = Grant.decode_prefix(raw)
        if len(raw) != end + _KEY:
            raise ValueError("join token has the wrong length")
        if not grant.verify():
            raise ValueError("join token signature does not verify for its network")
        secret = raw[end:]
        if _raw_public(Ed25519PrivateKey.from_private_bytes(secret)) != grant.provider_key:
            raise ValueError("join token provider key does not match its grant")
        return cls(grant, secret)

    def prove(self, identity: Identity) -> MembershipProof:
        """The membership proof of the node with `identity`."""
        provider = Ed25519PrivateKey.from_private_bytes(self.provider_secret)
        return MembershipProof(self.grant, provider.sign(_member_payload(self.grant, identity.public_bytes)))
