"""Node identity: a persisted Ed25519 key and the libp2p-style peer id derived from its public key."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from opentela._types import PeerId

# A libp2p peer id for an Ed25519 key is the identity multihash (0x00, length 0x24) of the protobuf
# PublicKey{Type: Ed25519 (0x08 0x01), Data: 32 bytes (0x12 0x20)}; base58btc renders it as "12D3KooW...".
# Using the same shape keeps ids familiar to libp2p users and lets anyone verify a signature from the id alone.
_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_ALPHABET[rem])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def _b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        try:
            n = n * 58 + _INDEX[ch]
        except KeyError:
            raise ValueError(f"invalid base58 character {ch!r}") from None
    pad = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * pad + body


def peer_id_from_public_key(public_key: bytes) -> PeerId:
    """Derive the peer id of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise ValueError("an Ed25519 public key has 32 bytes")
    return _b58encode(_PREFIX + public_key)


def public_key_from_peer_id(peer_id: PeerId) -> bytes:
    """Recover the raw Ed25519 public key a peer id encodes; ValueError if it is not one."""
    raw = _b58decode(peer_id)
    if len(raw) != len(_PREFIX) + 32 or not raw.startswith(_PREFIX):
        raise ValueError(f"not an Ed25519 peer id: {peer_id!r}")
    return raw[len(_PREFIX) :]


def is_peer_id(text: str) -> bool:
    """True when `text` is a well-formed Ed25519 peer id."""
    try:
        public_key_from_peer_id(text)
    except ValueError:
        return False
    return True


def verify_signature(peer_id: PeerId, data: bytes, signature: bytes) -> bool:
    """Check an Ed25519 signature made by the key behind `peer_id`."""
    try:
        key = Ed25519PublicKey.from_public_bytes(public_key_from_peer_id(peer_id))
        key.verify(signature, data)
    except (ValueError, InvalidSignature):
        return False
    return True


class Identity:
    """An Ed25519 private key and the peer id it proves."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self.private_key = private_key
        self.public_bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.peer_id: PeerId = peer_id_from_public_key(self.public_bytes)

    def __repr__(self) -> str:
        return f"<Identity {self.peer_id}>"

    @classmethod
    def generate(cls) -> Identity:
        """A new random identity (not persisted)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key at `path`, creating it (mode 0600) on first use."""
        path = Path(path)
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} does not hold an Ed25519 private key")
            return cls(key)
        identity = cls.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = identity.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        tmp = path.with_suffix(path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        os.replace(tmp, path)
        return identity

    def sign(self, data: bytes) -> bytes:
        """Sign `data` with the identity key."""
        return self.private_key.sign(data)
