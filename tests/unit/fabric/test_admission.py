"""Join tokens, membership proofs and the admission policy, without sockets."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from opentela.errors import AdmissionError, ConfigError
from opentela.fabric._config import FabricConfig
from opentela.fabric.admission import Admission, admission_from_config
from opentela.fabric.identity import Identity, _b58encode
from opentela.fabric.join_tokens import (
    JoinToken,
    MembershipProof,
    create_network_key,
    load_network_key,
    network_id_of,
    network_key_of,
)

NET = Ed25519PrivateKey.generate()
OTHER_NET = Ed25519PrivateKey.generate()


def network_id(key: Ed25519PrivateKey = NET) -> str:
    return network_id_of(key.public_key().public_bytes_raw())


def member(provider: str = "lab-a", key: Ed25519PrivateKey = NET, **kw: int) -> tuple[Identity, Admission]:
    identity = Identity.generate()
    return identity, Admission.closed(JoinToken.issue(key, provider, **kw), identity)


def test_a_token_round_trips_and_names_its_network_and_provider() -> None:
    token = JoinToken.issue(NET, "lab-a", expires_at=int(time.time()) + 3600)
    text = token.encode()
    assert text.startswith("otjoin1_")
    back = JoinToken.decode(text)
    assert back == token
    assert back.grant.network_id == network_id()
    assert back.grant.provider_id == "lab-a"
    assert back.grant.describe()["expired"] is False
    # The secret half never shows up in a repr.
    assert token.provider_secret.hex() not in repr(token)


def test_network_ids_are_self_certifying() -> None:
    nid = network_id()
    assert nid.startswith("otn_")
    assert network_key_of(nid) == NET.public_key().public_bytes_raw()
    too_short = "otn_" + _b58encode(b"\xff" * 31)
    for bad in ("otn_", "12D3KooWabc", nid[4:], "otn_0OIl", "otn_" + "1" * 44, "otn_" + "z" * 50, too_short):
        with pytest.raises(ValueError):
            network_key_of(bad)


def test_a_member_admits_another_member_of_the_same_network() -> None:
    a, adm_a = member("lab-a")
    b, adm_b = member("lab-b")
    grant = adm_a.check(adm_b.proof, b.peer_id, provider_id="lab-b")
    assert grant is not None and grant.provider_id == "lab-b"
    assert adm_b.check(adm_a.proof, a.peer_id) is not None


def test_an_open_node_admits_everyone_and_shows_nothing() -> None:
    open_ = Admission.open()
    assert not open_.is_closed and open_.proof == b""
    assert open_.check(b"", Identity.generate().peer_id) is None


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("no proof", "no membership proof"),
        ("other network", "is a member of network"),
        ("expired", "expired"),
        ("copied proof", "made for another node"),
        ("other provider", "its join token is for"),
        ("garbage", "malformed"),
        ("revoked", "revoked"),
        ("from the future", "future"),
    ],
)
def test_non_members_are_refused_with_the_reason(case: str, needle: str) -> None:
    _, judge = member("lab-a")
    peer, adm = member("lab-b")
    proof, provider = adm.proof, None
    if case == "no proof":
        proof = b""
    elif case == "other network":
        proof = Admission.closed(JoinToken.issue(OTHER_NET, "lab-b"), peer).proof
    elif case == "expired":
        proof = Admission.closed(JoinToken.issue(NET, "lab-b", expires_at=int(time.time()) - 1), peer).proof
    elif case == "copied proof":
        peer = Identity.generate()  # someone else presenting lab-b's node proof
    elif case == "other provider":
        provider = "lab-c"
    elif case == "garbage":
        proof = os.urandom(300)
    elif case == "revoked":
        assert adm.own is not None
        judge = Admission(judge.network_id, judge.own, revoked=frozenset({adm.own.grant.token_id}))
    elif case == "from the future":
        proof = Admission.closed(JoinToken.issue(NET, "lab-b", now=time.time() + 3600), peer).proof
    with pytest.raises(AdmissionError, match=needle):
        judge.check(proof, peer.peer_id, provider_id=provider)


def test_a_forged_grant_does_not_verify() -> None:
    # A grant claiming our network but signed by another key: the signature check catches it.
    token = JoinToken.issue(OTHER_NET, "lab-x")
    fake = MembershipProof(
        type(token.grant)(**{**token.grant.__dict__, "network_key": NET.public_key().public_bytes_raw()}),
        b"\0" * 64,
    )
    _, judge = member()
    with pytest.raises(AdmissionError, match="not signed by network"):
        judge.check(fake.encode(), Identity.generate().peer_id)


def test_verified_proofs_are_cached_but_expiry_is_checked_every_time() -> None:
    _, judge = member()
    peer, adm = member("lab-b", expires_at=int(time.time()) + 60)
    assert judge.check(adm.proof, peer.peer_id) is not None
    assert judge.check(adm.proof, peer.peer_id) is not None
    with pytest.raises(AdmissionError, match="expired"):
        judge.check(adm.proof, peer.peer_id, now=time.time() + 120)
    # The grant is known now, yet another node showing the same proof is still caught.
    with pytest.raises(AdmissionError, match="made for another node"):
        judge.check(adm.proof, Identity.generate().peer_id)


def test_the_network_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "network.key"
    key = create_network_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_network_key(path).private_bytes_raw() == key.private_bytes_raw()
    with pytest.raises(ConfigError, match="never overwritten"):
        create_network_key(path)
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(ConfigError, match="cannot read"):
        load_network_key(tmp_path / "junk")


def test_node_settings_build_the_policy(tmp_path: Path) -> None:
    identity = Identity.generate()
    assert not admission_from_config(FabricConfig(), identity).is_closed
    text = JoinToken.issue(NET, "lab-a").encode()
    closed = admission_from_config(FabricConfig(join_token=text), identity)
    assert closed.network_id == network_id() and closed.provider_id == "lab-a"
    file = tmp_path / "token"
    file.write_text(text + "\n")
    assert admission_from_config(FabricConfig(join_token_file=str(file)), identity).is_closed
    pinned = FabricConfig(join_token=text, network_id=network_id())
    assert admission_from_config(pinned, identity).network_id == network_id()
    # The token itself stays out of the config's repr (`otela config show`).
    assert text not in repr(FabricConfig(join_token=text))


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"network_id": "NET"}, "needs a join token"),
        ({"join_token": "otjoin1_AAAA"}, "bad join token"),
        ({"join_token": "TOKEN", "network_id": "OTHER"}, "is for network"),
        ({"join_token": "EXPIRED"}, "expired"),
        ({"join_token": "TOKEN", "join_token_file": "/nonexistent"}, "not both"),
        ({"join_token_file": "/nonexistent/token"}, "cannot read"),
        ({"join_token": "TOKEN", "revoked_tokens": ("zz",)}, "not hex"),
        ({"join_token": "TOKEN", "revoked_tokens": ("OWN",)}, "revoked"),
    ],
)
def test_bad_node_settings_are_config_errors(settings: dict[str, object], needle: str) -> None:
    token = JoinToken.issue(NET, "lab-a")
    values = {
        "NET": network_id(),
        "OTHER": network_id(OTHER_NET),
        "TOKEN": token.encode(),
        "EXPIRED": JoinToken.issue(NET, "lab-a", expires_at=int(time.time()) - 10).encode(),
    }
    resolved: dict[str, object] = {}
    for name, value in settings.items():
        if value == ("OWN",):
            value = (token.grant.token_id.hex(),)
        resolved[name] = values.get(value, value) if isinstance(value, str) else value
    with pytest.raises(ConfigError, match=needle):
        admission_from_config(FabricConfig(**resolved), Identity.generate())  # type: ignore[arg-type]
