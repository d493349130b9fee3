"""The OpenID Connect login's protocol steps with no network: PKCE, state and nonce, the ID token's checks, which
accounts are admitted, the cookie signatures and which group's limits a user gets."""

from __future__ import annotations

import base64
import hashlib
import json
import string
import time
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey, RSAKey
from starlette.requests import Request

from opentela.frontend import FrontendConfig
from opentela.frontend.errors import CrossOriginError
from opentela.frontend.limits import BUILTIN_GROUP_LIMITS, DEFAULT_GROUP, GroupLimits, pick_group
from opentela.frontend.oidc import (
    LOGIN_TTL_S,
    LoginError,
    LoginFlow,
    ProviderError,
    ProviderMetadata,
    UnknownSigningKeyError,
    admission_refusal,
    authorization_url,
    callback_code,
    groups_of,
    pkce_challenge,
    safe_next,
    token_request,
    verify_id_token,
)
from opentela.frontend.routes.auth import same_origin
from opentela.frontend.sessions import LOGIN_COOKIE, SESSION_COOKIE, CookieSigner

ISSUER = "https://id.uni.example"
CLIENT = "otela-dashboard"
NOW = 1_800_000_000.0

META = ProviderMetadata(
    issuer=ISSUER,
    authorization_endpoint=ISSUER + "/authorize",
    token_endpoint=ISSUER + "/token",
    jwks_uri=ISSUER + "/jwks",
    userinfo_endpoint=None,
    end_session_endpoint=None,
    algorithms=("RS256",),
)


def test_pkce_challenge_is_rfc_7636_s256() -> None:
    # RFC 7636, appendix B.
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert pkce_challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_a_flow_has_fresh_unguessable_values_and_survives_its_cookie() -> None:
    a, b = LoginFlow.start("/#keys", NOW), LoginFlow.start(None, NOW)
    allowed = set(string.ascii_letters + string.digits + "-._~")
    # RFC 7636 4.1: 43 to 128 characters of the unreserved set; 256 bits each.
    assert 43 <= len(a.verifier) <= 128 and set(a.verifier) <= allowed
    assert len({a.state, a.nonce, a.verifier, b.state, b.nonce, b.verifier}) == 6
    assert a.next == "/#keys" and b.next == "/"
    assert LoginFlow.loads(a.dumps()) == a
    assert LoginFlow.loads(b"not json") is None and LoginFlow.loads(b'{"state": "x"}') is None


@pytest.mark.parametrize(
    ("asked", "kept"),
    [
        ("/#keys", "/#keys"),
        ("/docs", "/docs"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("/\t/evil.example", "/"),
        ("/\n/evil.example", "/"),
        ("evil", "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_after_login_the_browser_returns_only_to_this_site(asked: str | None, kept: str) -> None:
    assert safe_next(asked) == kept
    assert LoginFlow.start(asked).next == kept


def test_the_authorization_request_asks_for_a_code_with_pkce_state_and_nonce() -> None:
    flow = LoginFlow.start("/", NOW)
    url = authorization_url(
        META,
        client_id=CLIENT,
        redirect_uri="https://ai.uni.example/auth/callback",
        scopes=("email", "openid"),
        flow=flow,
    )
    assert url.startswith(META.authorization_endpoint + "?")
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert q["response_type"] == "code" and q["client_id"] == CLIENT
    assert q["redirect_uri"] == "https://ai.uni.example/auth/callback"
    assert q["scope"] == "openid email"  # openid first and once
    assert q["state"] == flow.state and q["nonce"] == flow.nonce
    assert q["code_challenge_method"] == "S256"
    digest = hashlib.sha256(flow.verifier.encode()).digest()
    assert q["code_challenge"] == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert flow.verifier not in url  # the verifier never leaves the frontend before the code exchange


def test_the_callback_must_answer_this_browsers_login() -> None:
    flow = LoginFlow.start("/", NOW)
    ok = {"state": flow.state, "code": "abc"}
    assert callback_code(ok, flow, NOW + 5) == "abc"
    with pytest.raises(LoginError, match="no login in progress"):
        callback_code(ok, None, NOW)
    with pytest.raises(LoginError, match="state mismatch"):
        callback_code({**ok, "state": LoginFlow.start("/").state}, flow, NOW)
    with pytest.raises(LoginError, match="state mismatch"):
        callback_code({"code": "abc"}, flow, NOW)
    with pytest.raises(LoginError, match="longer than 10 minutes"):
        callback_code(ok, flow, NOW + LOGIN_TTL_S + 1)
    with pytest.raises(LoginError, match="did not log you in: User denied"):
        callback_code(
            {"state": flow.state, "error": "access_denied", "error_description": "User denied"}, flow, NOW
        )
    with pytest.raises(LoginError, match="no authorization code"):
        callback_code({"state": flow.state}, flow, NOW)


def test_the_code_exchange_sends_the_verifier_and_authenticates_a_confidential_client() -> None:
    flow = LoginFlow.start("/", NOW)
    form, headers = token_request(
        "the-code", flow, redirect_uri="https://x/auth/callback", client_id="a:b", client_secret="s&t"
    )
    assert form == {
        "grant_type": "authorization_code",
        "code": "the-code",
        "redirect_uri": "https://x/auth/callback",
        "code_verifier": flow.verifier,
        "client_id": "a:b",
    }
    # RFC 6749 2.3.1: both halves form-encoded before Basic.
    assert base64.b64decode(headers["Authorization"].removeprefix("Basic ")) == b"a%3Ab:s%26t"
    _, public = token_request("c", flow, redirect_uri="r", client_id="a", client_secret="")
    assert "Authorization" not in public


# ---- ID tokens ----------------------------------------------------------------------------------------------

SIGNING = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"})
OTHER = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"})
KEYS = KeySet.import_key_set({"keys": [SIGNING.as_dict(private=False)]})


def _token(key: Any = SIGNING, alg: str = "RS256", kid: str | None = "k1", **changes: Any) -> str:
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": CLIENT,
        "exp": int(NOW) + 300,
        "iat": int(NOW),
        "nonce": "n-1",
        "email": "alice@uni.example",
    }
    claims.update(changes)
    header = {"alg": alg, **({"kid": kid} if kid else {})}
    return jwt.encode(header, {k: v for k, v in claims.items() if v is not None}, key, algorithms=[alg])


def _verify(token: str, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"issuer": ISSUER, "client_id": CLIENT, "nonce": "n-1", "now": NOW, **kw}
    return verify_id_token(token, KEYS, **args)


def test_a_good_id_token_verifies() -> None:
    claims = _verify(_token())
    assert claims["sub"] == "alice" and claims["email"] == "alice@uni.example"
    assert _verify(_token(aud=[CLIENT, "other"], azp=CLIENT))["sub"] == "alice"
    assert _verify(_token(), now=NOW + 300 + 30)["sub"] == "alice"  # within the clock-skew leeway


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        (lambda: _token(key=OTHER), "does not verify"),
        (lambda: _token()[:-6] + "AAAAAA", "does not verify"),
        (lambda: _tampered(sub="mallory"), "does not verify"),
        (lambda: _token(iss="https://evil.example"), "another provider"),
        (lambda: _token(aud="someone-else"), "another client"),
        (lambda: _token(aud=[CLIENT, "other"]), "several audiences"),
        (lambda: _token(aud=[CLIENT, "other"], azp="other"), "several audiences"),
        (lambda: _token(nonce="n-2"), "nonce mismatch"),
        (lambda: _token(nonce=None), "nonce mismatch"),
        (lambda: _token(exp=int(NOW) - 120), "expired"),
        (lambda: _token(exp=None), "has expired"),
        (lambda: _token(iat=int(NOW) + 3600), "issue time"),
        (lambda: _token(sub=None), "names no subject"),
        (lambda: _token(key=OctKey.import_key(b"k" * 32), alg="HS256"), "does not verify"),
        (lambda: _unsigned(), "does not verify"),
        (lambda: "not-a-token", "malformed|does not verify"),
    ],
)
def test_a_bad_id_token_is_refused_with_the_reason(token: Any, problem: str) -> None:
    with pytest.raises(LoginError, match=problem):
        _verify(token())


def test_a_token_signed_by_an_unknown_key_asks_for_the_keys_again() -> None:
    stranger = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    with pytest.raises(UnknownSigningKeyError):
        _verify(_token(key=stranger, kid="k2"))


def _b64json(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def _tampered(**claims: Any) -> str:
    header, payload, signature = _token().split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return ".".join((header, _b64json({**body, **claims}), signature))


def _unsigned() -> str:
    claims = {
        "iss": ISSUER,
        "sub": "alice",
        "aud": CLIENT,
        "exp": int(NOW) + 300,
        "iat": int(NOW),
        "nonce": "n-1",
    }
    return _b64json({"alg": "none", "kid": "k1"}) + "." + _b64json(claims) + "."


def test_discovery_must_name_the_configured_issuer_and_a_usable_signature() -> None:
    doc = {
        "issuer": ISSUER,
        "authorization_endpoint": ISSUER + "/a",
        "token_endpoint": ISSUER + "/t",
        "jwks_uri": ISSUER + "/k",
        "end_session_endpoint": ISSUER + "/logout",
        "id_token_signing_alg_values_supported": ["HS256", "ES256", "RS256"],
    }
    meta = ProviderMetadata.from_discovery(doc, ISSUER + "/")
    assert meta.algorithms == ("RS256", "ES256") and meta.end_session_endpoint == ISSUER + "/logout"
    assert meta.userinfo_endpoint is None
    with pytest.raises(ProviderError, match="names issuer"):
        ProviderMetadata.from_discovery({**doc, "issuer": "https://evil.example"}, ISSUER)
    with pytest.raises(ProviderError, match="lacks jwks_uri"):
        ProviderMetadata.from_discovery({k: v for k, v in doc.items() if k != "jwks_uri"}, ISSUER)
    with pytest.raises(ProviderError, match="only with"):
        ProviderMetadata.from_discovery({**doc, "id_token_signing_alg_values_supported": ["HS256"]}, ISSUER)


# ---- who is admitted ----------------------------------------------------------------------------------------


def _refusal(
    claims: dict[str, Any], domains: tuple[str, ...] = (), groups: tuple[str, ...] = (), claim: str = "groups"
):
    return admission_refusal(claims, domains=domains, groups=groups, groups_claim=claim)


def test_an_email_in_an_allowed_domain_or_an_allowed_group_is_admitted() -> None:
    domains, groups = ("Uni.example",), ("physics",)
    assert _refusal({"sub": "a", "email": "a@UNI.EXAMPLE"}, domains, groups) is None
    assert (
        _refusal({"sub": "b", "email": "b@other.example", "groups": ["physics", "x"]}, domains, groups)
        is None
    )
    assert _refusal({"sub": "c", "email": "c@uni.example", "email_verified": True}, domains) is None
    refused = _refusal({"sub": "m", "email": "m@other.example", "groups": ["chemistry"]}, domains, groups)
    assert refused is not None and "m@other.example" in refused
    assert "in no email domain or group this service admits" in refused
    # Look-alike domains and unverified addresses do not match.
    assert _refusal({"sub": "d", "email": "d@evil-uni.example"}, domains) is not None
    assert _refusal({"sub": "e", "email": "e@uni.example.evil"}, domains) is not None
    assert _refusal({"sub": "f", "email": "f@uni.example", "email_verified": False}, domains) is not None
    assert _refusal({"sub": "g"}, domains) is not None


def test_with_nothing_configured_everyone_the_provider_knows_is_admitted() -> None:
    assert _refusal({"sub": "anyone"}) is None


def test_groups_come_from_the_configured_claim_list_string_or_nested() -> None:
    claims = {
        "groups": ["a", "", 7],
        "role": "staff",
        "realm_access": {"roles": ["physics"]},
        "bad": {"x": 1},
    }
    assert groups_of(claims, "groups") == ["a", "7"]
    assert groups_of(claims, "role") == ["staff"]
    assert groups_of(claims, "realm_access.roles") == ["physics"]
    assert groups_of(claims, "bad") == [] and groups_of(claims, "missing.path") == []
    assert _refusal({"sub": "k", **claims}, groups=("physics",), claim="realm_access.roles") is None
    assert _refusal({"sub": "k", **claims}, groups=("physics",)) is not None


# ---- cookies ------------------------------------------------------------------------------------------------


def test_cookies_are_signed_per_purpose() -> None:
    signer = CookieSigner(b"k" * 32)
    value = signer.sign(SESSION_COOKIE, b"secret")
    assert signer.unsign(SESSION_COOKIE, value) == b"secret"
    assert signer.unsign(LOGIN_COOKIE, value) is None  # a session cookie is no login in progress
    assert CookieSigner(b"j" * 32).unsign(SESSION_COOKIE, value) is None
    _, mac = value.split(".")
    assert (
        signer.unsign(SESSION_COOKIE, base64.urlsafe_b64encode(b"secreT").decode().rstrip("=") + "." + mac)
        is None
    )
    for junk in (None, "", "x", "a.b.c", "!!.!!", "a" * 5000):
        assert signer.unsign(SESSION_COOKIE, junk) is None


# ---- group limits -------------------------------------------------------------------------------------------


def test_a_user_gets_the_limits_of_their_group_allowing_the_most_keys() -> None:
    table = {
        "physics": GroupLimits(max_keys=2, rpm_limit=60),
        "admins": GroupLimits(max_keys=5),
        "beta": GroupLimits(max_keys=5, budget_tokens=10),
        DEFAULT_GROUP: GroupLimits(max_keys=1, budget_tokens=1000),
    }
    assert pick_group(["physics"], table) == ("physics", table["physics"])
    assert pick_group(["physics", "beta", "admins"], table) == ("admins", table["admins"])  # tie: first name
    assert pick_group(["chemistry"], table) == (DEFAULT_GROUP, table[DEFAULT_GROUP])
    assert pick_group([DEFAULT_GROUP], {"physics": table["physics"]}) == (None, BUILTIN_GROUP_LIMITS)
    assert pick_group([], {}) == (None, BUILTIN_GROUP_LIMITS)


def test_time_is_not_read_when_given() -> None:
    # Every check above takes `now`; a flow started long ago is refused whatever the clock says.
    old = LoginFlow.start("/", time.time() - 2 * LOGIN_TTL_S)
    with pytest.raises(LoginError):
        callback_code({"state": old.state, "code": "c"}, old)


# ---- cross-origin changes -----------------------------------------------------------------------------------


def _request(headers: dict[str, str], redirect_url: str = "") -> Request:
    login = SimpleNamespace(config=FrontendConfig(oidc_redirect_url=redirect_url))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/me/keys",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "app": SimpleNamespace(state=SimpleNamespace(login=login)),
    }
    return Request(scope)


def test_changes_must_come_from_the_dashboards_own_origin() -> None:
    same_origin(_request({"Host": "127.0.0.1:8093", "Origin": "http://127.0.0.1:8093"}))
    # Behind a reverse proxy that passes on its own Host, the configured public callback URL names the origin.
    behind = {"Host": "127.0.0.1:8093", "Origin": "https://ai.uni.example"}
    same_origin(_request(behind, "https://ai.uni.example/auth/callback"))
    for headers in (
        behind,
        {"Host": "127.0.0.1:8093"},
        {"Host": "127.0.0.1:8093", "Origin": "null"},
        {"Host": "127.0.0.1:8093", "Origin": "http://127.0.0.1:8094"},
        {"Host": "ai.uni.example", "Origin": "https://evil.uni.example"},
        {"Origin": "http://"},
    ):
        with pytest.raises(CrossOriginError):
            same_origin(_request(headers))
