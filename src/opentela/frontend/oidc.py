"""OpenID Connect login, the protocol steps with no I/O: PKCE, state and nonce, the authorization request, the
callback's checks, the ID token's checks (signature by the provider's keys, issuer, audience, expiry, nonce) and
which accounts are admitted."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from joserfc import jwt
from joserfc.errors import ClaimError, ExpiredTokenError, InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

SIGNING_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
"""The ID token signatures accepted: public-key ones only, so a token verifies by the provider's published keys
(never `none`, never a MAC keyed with the client secret)."""
LEEWAY_S = 60
"""Clock skew tolerated between the provider and this host when checking `exp` and `iat`."""
LOGIN_TTL_S = 600.0
"""How long a started login may take: the user has this long at the provider's page."""


class LoginError(Exception):
    """The login failed; `message` says why, for the page the browser lands on."""

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LoginRefusedError(LoginError):
    """The provider authenticated the user, but this frontend does not admit them (domain or group)."""

    status_code = 403


class ProviderError(LoginError):
    """The provider did not answer, or answered something no compliant provider would."""

    status_code = 502


class UnknownSigningKeyError(LoginError):
    """The ID token names a key that is not in the provider's key set as last fetched (keys were rotated)."""


@dataclass(frozen=True)
class ProviderMetadata:
    """What discovery told about the provider (only what login needs)."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    end_session_endpoint: str | None
    algorithms: tuple[str, ...]

    @classmethod
    def from_discovery(cls, doc: Any, expected_issuer: str) -> ProviderMetadata:
        """Checked discovery: the document must name the configured issuer itself (OpenID Connect Discovery 4.3),
        so a look-alike provider cannot stand in for it."""
        if not isinstance(doc, dict):
            raise ProviderError("the provider's discovery document is not a JSON object")
        if doc.get("issuer") not in (expected_issuer, expected_issuer.rstrip("/")):
            raise ProviderError(
                f"the provider's discovery document names issuer {doc.get('issuer')!r}, not {expected_issuer!r}"
            )
        needed = ("authorization_endpoint", "token_endpoint", "jwks_uri")
        missing = [name for name in needed if not isinstance(doc.get(name), str)]
        if missing:
            raise ProviderError(f"the provider's discovery document lacks {', '.join(missing)}")
        offered = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = tuple(a for a in SIGNING_ALGORITHMS if a in offered)
        if not algorithms:
            raise ProviderError(
                f"the provider signs ID tokens only with {offered}, none of {SIGNING_ALGORITHMS}"
            )
        optional = {name: doc.get(name) for name in ("userinfo_endpoint", "end_session_endpoint")}
        return cls(
            issuer=str(doc["issuer"]),
            authorization_endpoint=doc["authorization_endpoint"],
            token_endpoint=doc["token_endpoint"],
            jwks_uri=doc["jwks_uri"],
            userinfo_endpoint=optional["userinfo_endpoint"]
            if isinstance(optional["userinfo_endpoint"], str)
            else None,
            end_session_endpoint=(
                optional["end_session_endpoint"]
                if isinstance(optional["end_session_endpoint"], str)
                else None
            ),
            algorithms=algorithms,
        )


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge of a PKCE verifier (RFC 7636 section 4.2)."""
    return _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def safe_next(value: str | None) -> str:
    """Where to send the browser after login: a path on this site, never another site (`//host`, `https://...`)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in value):  # browsers drop tabs and newlines: "/\t/evil"
        return "/"
    parts = urlsplit(value)
    return "/" if parts.scheme or parts.netloc else value


@dataclass(frozen=True)
class LoginFlow:
    """One login in progress, kept by the browser in a signed cookie between the redirect and the callback.

    `state` ties the callback to this browser (CSRF), `nonce` ties the ID token to this login (replay), `verifier`
    is the PKCE secret only this frontend knows (a stolen code is useless without it).
    """

    state: str
    nonce: str
    verifier: str
    next: str
    started_at: float

    @classmethod
    def start(cls, next_path: str | None, now: float | None = None) -> LoginFlow:
        """A new flow with fresh random values (256 bits each; the verifier is 43 characters, as RFC 7636 asks)."""
        return cls(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(32),
            next=safe_next(next_path),
            started_at=time.time() if now is None else now,
        )

    def dumps(self) -> bytes:
        """As the cookie carries it (signed by the caller)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def loads(cls, raw: bytes) -> LoginFlow | None:
        """The flow a cookie held; None when it is not one."""
        try:
            data = json.loads(raw)
            return cls(
                state=str(data["state"]),
                nonce=str(data["nonce"]),
                verifier=str(data["verifier"]),
                next=safe_next(str(data["next"])),
                started_at=float(data["started_at"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def authorization_url(
    meta: ProviderMetadata, *, client_id: str, redirect_uri: str, scopes: Iterable[str], flow: LoginFlow
) -> str:
    """The provider's authorization request for `flow`: code flow, PKCE S256, state and nonce."""
    wanted = ["openid", *(s for s in scopes if s != "openid")]
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": " ".join(dict.fromkeys(wanted)),
        "state": flow.state,
        "nonce": flow.nonce,
        "code_challenge": pkce_challenge(flow.verifier),
        "code_challenge_method": "S256",
    }
    sep = "&" if urlsplit(meta.authorization_endpoint).query else "?"
    return meta.authorization_endpoint + sep + urlencode(params)


def callback_code(params: Mapping[str, str], flow: LoginFlow | None, now: float | None = None) -> str:
    """The authorization code of a callback, once it is known to answer the login this browser started."""
    now = time.time() if now is None else now
    if flow is None:
        raise LoginError("this browser has no login in progress (or its cookie was refused); start again")
    state_matches = hmac.compare_digest(params.get("state", "").encode(), flow.state.encode())
    if "error" in params and (state_matches or "state" not in params):
        # Some providers leave the state out of an error answer; nothing is granted on one, so it is shown as is.
        detail = params.get("error_description") or params["error"]
        raise LoginError(f"the provider did not log you in: {detail}")
    if not state_matches:
        raise LoginError("the answer does not belong to the login this browser started (state mismatch)")
    if now - flow.started_at > LOGIN_TTL_S:
        raise LoginError(f"the login took longer than {LOGIN_TTL_S / 60:.0f} minutes; start again")
    code = params.get("code", "")
    if not code:
        raise LoginError("the provider's answer carries no authorization code")
    return code


def token_request(
    code: str, flow: LoginFlow, *, redirect_uri: str, client_id: str, client_secret: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The form and headers of the code exchange: the PKCE verifier always, the client secret (HTTP Basic, the
    default method of RFC 6749 section 2.3.1) for a confidential client."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "code_verifier": flow.verifier,
        "client_id": client_id,
    }
    headers = {"Accept": "application/json"}
    if client_secret:
        basic = f"{quote(client_id, safe='')}:{quote(client_secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(basic.encode()).decode()
    return form, headers


_CLAIM_PROBLEMS = {
    "iss": "was issued by another provider",
    "aud": "was issued to another client",
    "nonce": "does not belong to this login (nonce mismatch)",
    "sub": "names no subject",
    "exp": "has expired",
    "iat": "has no valid issue time",
}


def verify_id_token(
    raw: str,
    keys: KeySet,
    *,
    issuer: str,
    client_id: str,
    nonce: str,
    algorithms: Iterable[str] = SIGNING_ALGORITHMS,
    now: float | None = None,
) -> dict[str, Any]:
    """The claims of an ID token, after checking its signature by the provider's key set, its issuer, audience
    (and authorized party when it has several audiences), expiry, issue time and nonce (OpenID Connect Core
    3.1.3.7). Raises UnknownSigningKeyError when the token names a key the set lacks, LoginError otherwise."""
    allowed = [a for a in algorithms if a in SIGNING_ALGORITHMS]
    try:
        token = jwt.decode(raw, keys, algorithms=allowed)
    except InvalidKeyIdError as exc:
        raise UnknownSigningKeyError(
            "the ID token is signed with a key the provider does not publish"
        ) from exc
    except JoseError as exc:
        raise LoginError(f"the ID token does not verify: {exc.description or exc.error}") from exc
    except ValueError as exc:  # not a JWS at all
        raise LoginError(f"the ID token is malformed: {exc}") from exc
    claims = token.claims
    registry = jwt.JWTClaimsRegistry(
        now=int(time.time() if now is None else now),
        leeway=LEEWAY_S,
        iss={"essential": True, "value": issuer},
        aud={"essential": True, "value": client_id},
        sub={"essential": True},
        exp={"essential": True},
        iat={"essential": True},
        nonce={"essential": True, "value": nonce},
    )
    try:
        registry.validate(claims)
    except ExpiredTokenError as exc:
        raise LoginError("the ID token has expired") from exc
    except ClaimError as exc:
        problem = _CLAIM_PROBLEMS.get(exc.claim.split(",")[0], f"has a bad {exc.claim!r} claim")
        raise LoginError(f"the ID token {problem}") from exc
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise LoginError("the ID token has several audiences and is not authorized for this client (azp)")
    return claims


def claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """The claim at a dotted path (`realm_access.roles`), or None."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def groups_of(claims: Mapping[str, Any], claim: str) -> list[str]:
    """A user's groups from the configured claim: a list of strings, or one string."""
    value = claims.get(claim) if claim in claims else claim_at(claims, claim)
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [str(v) for v in value if isinstance(v, (str, int)) and str(v)]
    return []


def email_domain(claims: Mapping[str, Any]) -> str | None:
    """The domain of the user's email, lower case; None without an email, or one the provider marks unverified."""
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email or claims.get("email_verified") is False:
        return None
    return email.rsplit("@", 1)[1].strip().lower() or None


def admission_refusal(
    claims: Mapping[str, Any], *, domains: Iterable[str], groups: Iterable[str], groups_claim: str
) -> str | None:
    """Why these claims are not admitted, or None when they are: an email in an allowed domain, or any allowed
    group, suffices; with neither configured, everyone the provider authenticates is admitted."""
    allowed_domains = {d.strip().lower().lstrip("@") for d in domains if d.strip()}
    allowed_groups = {g for g in groups if g}
    if not allowed_domains and not allowed_groups:
        return None
    if allowed_domains and email_domain(claims) in allowed_domains:
        return None
    if allowed_groups and allowed_groups.intersection(groups_of(claims, groups_claim)):
        return None
    who = claims.get("email") or claims.get("preferred_username") or claims.get("sub")
    asked = " or ".join(
        what for what, on in (("email domain", allowed_domains), ("group", allowed_groups)) if on
    )
    return f"Your account ({who}) is in no {asked} this service admits; ask its administrator for access."
