"""Join token and membership proof wire formats: every token round-trips, and any change to one is rejected."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import AdmissionError
from opentela.fabric.admission import Admission
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import TOKEN_PREFIX, Grant, JoinToken, MembershipProof

NET = Ed25519PrivateKey.generate()
TOKEN = JoinToken.issue(NET, "lab-a", expires_at=4_000_000_000)
RAW = TOKEN.grant.encode() + TOKEN.provider_secret
NODE = Identity.generate()
PROOF = TOKEN.prove(NODE).encode()
JUDGE = Admission.closed(JoinToken.issue(NET, "judge"), Identity.generate())

provider_ids = st.text(min_size=1, max_size=255).filter(lambda s: 0 < len(s.encode()) <= 255)
expiries = st.one_of(st.just(0), st.integers(1, 2**63 - 1))
timestamps = st.integers(0, 2**40)


def text_of(raw: bytes) -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@settings(max_examples=150, deadline=None)
@given(provider=provider_ids, expires=expiries, now=timestamps)
def test_every_token_round_trips(provider: str, expires: int, now: int) -> None:
    token = JoinToken.issue(NET, provider, expires_at=expires, now=now)
    back = JoinToken.decode(token.encode())
    assert back == token
    assert back.grant.provider_id == provider and back.grant.expires_at == expires
    assert back.grant.issued_at == now
    proof = MembershipProof.decode(token.prove(NODE).encode())
    assert proof.grant == token.grant and proof.binds(NODE.public_bytes)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(RAW) - 1), flip=st.integers(1, 255))
def test_any_changed_byte_of_a_token_is_rejected(index: int, flip: int) -> None:
    mutated = bytearray(RAW)
    mutated[index] ^= flip
    with pytest.raises(ValueError):
        JoinToken.decode(text_of(bytes(mutated)))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_changed_character_of_a_token_is_rejected(data: st.DataObject) -> None:
    text = TOKEN.encode()
    index = data.draw(st.integers(0, len(text) - 1))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=. "
    char = data.draw(st.sampled_from(alphabet).filter(lambda c: c != text[index]))
    with pytest.raises(ValueError):
        JoinToken.decode(text[:index] + char + text[index + 1 :])


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(RAW) - 1), extra=st.binary(min_size=1, max_size=40))
def test_truncated_or_extended_tokens_are_rejected(cut: int, extra: bytes) -> None:
    with pytest.raises(ValueError):
        JoinToken.decode(text_of(RAW[:cut]))
    with pytest.raises(ValueError):
        JoinToken.decode(text_of(RAW + extra))


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(PROOF) - 1), flip=st.integers(1, 255))
def test_any_changed_byte_of_a_membership_proof_is_refused(index: int, flip: int) -> None:
    assert JUDGE.check(PROOF, NODE.peer_id) is not None
    mutated = bytearray(PROOF)
    mutated[index] ^= flip
    with pytest.raises(AdmissionError):
        JUDGE.check(bytes(mutated), NODE.peer_id)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=400))
def test_garbage_never_escapes_value_error(raw: bytes) -> None:
    for parse in (Grant.decode_prefix, MembershipProof.decode):
        try:
            parse(raw)
        except ValueError:
            pass
    with pytest.raises(ValueError):
        JoinToken.decode(text_of(raw))
    with pytest.raises(AdmissionError):
        JUDGE.check(raw or b"\0", NODE.peer_id)
