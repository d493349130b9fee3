"""Admission control: whom a node lets in (anyone, or members of one closed network), checked on every proof shown.

The handshake (handshake.py) asks it about each peer, the registry about each record's owner. Credentials and
their wire formats live in tokens.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from opentela._types import PeerId
from opentela.errors import AdmissionError, ConfigError
from opentela.fabric._config import FabricConfig
from opentela.fabric.identity import Identity, public_key_from_peer_id
from opentela.fabric.join_tokens import Grant, JoinToken, MembershipProof, iso_time, network_key_of

CLOCK_SKEW = 300.0  # seconds a grant's issue time may lie in our future (clocks of operator and nodes differ)


class Admission:
    """Whom this node lets in: anyone (open network) or members of one network (closed)."""

    _CACHE_LIMIT = 4096

    def __init__(
        self,
        network_id: str | None = None,
        proof: MembershipProof | None = None,
        *,
        revoked: frozenset[bytes] = frozenset(),
    ) -> None:
        self.network_id = network_id
        self.network_key = network_key_of(network_id) if network_id else b""
        self.own = proof
        self.proof: bytes = proof.encode() if proof is not None else b""
        self.revoked = revoked
        # Verified (proof, node key) pairs: gossip re-delivers the same proofs with every record version.
        self._verified: dict[tuple[bytes, bytes], Grant] = {}
        # Verified grants: the many nodes of one provider share one, so a new node costs one signature check.
        self._grants: set[bytes] = set()

    def __repr__(self) -> str:
        return f"<Admission {'closed ' + self.network_id if self.network_id else 'open'}>"

    @classmethod
    def open(cls) -> Admission:
        """Admit every peer."""
        return cls()

    @classmethod
    def closed(
        cls, token: JoinToken, identity: Identity, *, revoked: frozenset[bytes] = frozenset()
    ) -> Admission:
        """Admit members of the token's network only, and prove our own membership with it."""
        return cls(token.grant.network_id, token.prove(identity), revoked=revoked)

    @property
    def is_closed(self) -> bool:
        """True in a closed network."""
        return bool(self.network_id)

    @property
    def provider_id(self) -> str:
        """The provider our token names ('' when open)."""
        return self.own.grant.provider_id if self.own else ""

    def check(
        self, proof: bytes, peer_id: PeerId, *, provider_id: str | None = None, now: float | None = None
    ) -> Grant | None:
        """The peer's verified grant (None when open); AdmissionError with the reason when it is not a member."""
        if not self.network_id:
            return None
        if not proof:
            raise AdmissionError(
                f"{peer_id} presented no membership proof for closed network {self.network_id}"
            )
        node_key = public_key_from_peer_id(peer_id)
        grant = self._verified.get((proof, node_key))
        if grant is None:
            try:
                member = MembershipProof.decode(proof)
            except ValueError as exc:
                raise AdmissionError(f"{peer_id} presented a malformed membership proof: {exc}") from None
            grant = member.grant
            if grant.network_key != self.network_key:
                raise AdmissionError(
                    f"{peer_id} is a member of network {grant.network_id}, not {self.network_id}"
                )
            grant_bytes = grant.encode()
            if grant_bytes not in self._grants and not grant.verify():
                raise AdmissionError(f"{peer_id} presented a grant not signed by network {self.network_id}")
            if not member.binds(node_key):
                raise AdmissionError(f"{peer_id} presented a membership proof made for another node")
            if len(self._verified) >= self._CACHE_LIMIT:
                self._verified.clear()
                self._grants.clear()
            self._verified[(proof, node_key)] = grant
            self._grants.add(grant_bytes)
        now = time.time() if now is None else now
        if grant.expired(now):
            raise AdmissionError(f"the join token of {peer_id} expired at {iso_time(grant.expires_at)}")
        if grant.issued_at > now + CLOCK_SKEW:
            raise AdmissionError(
                f"the join token of {peer_id} is issued in the future ({iso_time(grant.issued_at)})"
            )
        if grant.token_id in self.revoked:
            raise AdmissionError(f"the join token {grant.token_id.hex()} of {peer_id} is revoked")
        if provider_id is not None and provider_id != grant.provider_id:
            raise AdmissionError(
                f"{peer_id} claims provider {provider_id!r} but its join token is for {grant.provider_id!r}"
            )
        return grant


def admission_from_config(config: FabricConfig, identity: Identity) -> Admission:
    """The node's admission policy from its settings; ConfigError for a missing, bad or expired token."""
    join_token, join_token_file = config.join_token, config.join_token_file
    network_id, revoked_tokens = config.network_id, config.revoked_tokens
    text = join_token
    if join_token_file:
        if join_token:
            raise ConfigError("give the join token either inline or as a file, not both")
        try:
            text = Path(join_token_file).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the join token file: {exc}") from exc
    if not text.strip():
        if network_id:
            raise ConfigError(
                f"network {network_id} is closed: this node needs a join token to be part of it"
            )
        return Admission.open()
    try:
        token = JoinToken.decode(text)
    except ValueError as exc:
        raise ConfigError(f"bad join token: {exc}") from None
    if network_id:
        try:
            network_key_of(network_id)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if token.grant.network_id != network_id:
            raise ConfigError(f"the join token is for network {token.grant.network_id}, not {network_id}")
    if token.grant.expired():
        raise ConfigError(f"the join token expired at {iso_time(token.grant.expires_at)}")
    revoked = set()
    for text_id in revoked_tokens:
        try:
            revoked.add(bytes.fromhex(text_id))
        except ValueError:
            raise ConfigError(f"revoked token id {text_id!r} is not hex") from None
    if token.grant.token_id in revoked:
        raise ConfigError(f"this node's own join token {token.grant.token_id.hex()} is revoked")
    return Admission.closed(token, identity, revoked=frozenset(revoked))
