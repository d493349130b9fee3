"""The OpenID Connect provider as this frontend talks to it: discovery, the code exchange, its keys and userinfo.

The protocol's checks are in frontend/oidc.py; this module only fetches. Discovery happens on the first login, not
at start-up, so a provider that is down delays logins, never the API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from opentela.frontend._config import FrontendConfig
from opentela.frontend.oidc import (
    LoginFlow,
    ProviderError,
    ProviderMetadata,
    UnknownSigningKeyError,
    authorization_url,
    callback_code,
    groups_of,
    token_request,
    verify_id_token,
)

logger = logging.getLogger(__name__)

METADATA_TTL_S = 3600.0
"""How long discovery and the key set are reused (a token naming an unknown key refetches the keys at once)."""
KEYS_REFETCH_S = 30.0
"""Tokens naming unknown keys refetch the key set at most this often, so forged tokens cannot make us hammer it."""
HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Identity:
    """Who logged in: the provider's issuer and subject identify them; the rest is for display and admission."""

    issuer: str
    subject: str
    email: str | None
    name: str | None
    groups: tuple[str, ...]
    claims: Mapping[str, Any]
    id_token: str


class OidcClient:
    """One provider, configured by issuer, client id and secret. Close with `aclose()`."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self._http: aiohttp.ClientSession | None = None
        self._meta: tuple[ProviderMetadata, float] | None = None
        self._keys: tuple[KeySet, float] | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<OidcClient {self.config.oidc_issuer} as {self.config.oidc_client_id}>"

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        return self._http

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        """A JSON answer from the provider; ProviderError when it does not answer, or not with JSON."""
        where = urlsplit(url)._replace(query="").geturl()
        try:
            async with self._session().request(method, url, **kwargs) as resp:
                body = await resp.json(content_type=None)
                if resp.status >= 400:
                    detail = (
                        body.get("error_description") or body.get("error") if isinstance(body, dict) else None
                    )
                    raise ProviderError(
                        f"the provider answered {resp.status} at {where}: {detail or 'no detail'}"
                    )
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProviderError(
                f"the provider did not answer at {where}: {exc or type(exc).__name__}"
            ) from exc

    async def metadata(self) -> ProviderMetadata:
        """The provider's discovery document, checked (cached for an hour)."""
        now = time.monotonic()
        if self._meta is not None and now - self._meta[1] < METADATA_TTL_S:
            return self._meta[0]
        async with self._lock:
            if self._meta is None or now - self._meta[1] >= METADATA_TTL_S:
                issuer = self.config.oidc_issuer
                doc = await self._json("GET", issuer.rstrip("/") + "/.well-known/openid-configuration")
                self._meta = (ProviderMetadata.from_discovery(doc, issuer), time.monotonic())
                logger.info("OpenID Connect provider %s discovered", issuer)
            return self._meta[0]

    async def keys(self, *, refresh: bool = False) -> KeySet:
        """The provider's signing keys (its JWKS), refetched when stale or when asked to (at most every 30 s)."""
        meta = await self.metadata()
        now = time.monotonic()
        age = now - self._keys[1] if self._keys is not None else None
        if age is not None and age < METADATA_TTL_S and not (refresh and age >= KEYS_REFETCH_S):
            return self._keys[0]  # type: ignore[index]
        doc = await self._json("GET", meta.jwks_uri)
        try:
            keys = KeySet.import_key_set(doc)
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise ProviderError(f"the provider's key set cannot be read: {exc}") from exc
        self._keys = (keys, time.monotonic())
        return keys

    async def begin(self, next_path: str | None, redirect_uri: str) -> tuple[str, LoginFlow]:
        """Start a login: the provider URL to send the browser to, and the flow its cookie keeps."""
        meta = await self.metadata()
        flow = LoginFlow.start(next_path)
        url = authorization_url(
            meta,
            client_id=self.config.oidc_client_id,
            redirect_uri=redirect_uri,
            scopes=self.config.oidc_scopes,
            flow=flow,
        )
        return url, flow

    async def finish(self, params: Mapping[str, str], flow: LoginFlow | None, redirect_uri: str) -> Identity:
        """Complete a login from its callback: check state, exchange the code (with the PKCE verifier), verify
        the ID token; fetch userinfo when the ID token lacks the email or the groups claim."""
        code = callback_code(params, flow)
        assert flow is not None  # callback_code refused a missing flow
        meta = await self.metadata()
        form, headers = token_request(
            code,
            flow,
            redirect_uri=redirect_uri,
            client_id=self.config.oidc_client_id,
            client_secret=self.config.oidc_client_secret,
        )
        tokens = await self._json("POST", meta.token_endpoint, data=form, headers=headers)
        raw = tokens.get("id_token") if isinstance(tokens, dict) else None
        if not isinstance(raw, str):
            raise ProviderError(
                "the provider's token answer carries no ID token (is `openid` among the scopes?)"
            )
        claims = await self._verified(raw, meta, flow.nonce)
        access = tokens.get("access_token")
        groups_claim = self.config.oidc_groups_claim
        if (
            meta.userinfo_endpoint
            and isinstance(access, str)
            and ("email" not in claims or not groups_of(claims, groups_claim))
        ):
            claims = {**await self._userinfo(meta.userinfo_endpoint, access, claims["sub"]), **claims}
        email, name = claims.get("email"), claims.get("name") or claims.get("preferred_username")
        return Identity(
            issuer=meta.issuer,
            subject=str(claims["sub"]),
            email=str(email)[:320] if isinstance(email, str) else None,
            name=str(name)[:200] if isinstance(name, str) else None,
            groups=tuple(groups_of(claims, groups_claim)),
            claims=claims,
            id_token=raw,
        )

    async def _verified(self, raw: str, meta: ProviderMetadata, nonce: str) -> dict[str, Any]:
        client_id = self.config.oidc_client_id
        try:
            keys = await self.keys()
            return verify_id_token(
                raw, keys, issuer=meta.issuer, client_id=client_id, nonce=nonce, algorithms=meta.algorithms
            )
        except UnknownSigningKeyError:
            # The provider may have rotated its keys since we fetched them.
            keys = await self.keys(refresh=True)
            return verify_id_token(
                raw, keys, issuer=meta.issuer, client_id=client_id, nonce=nonce, algorithms=meta.algorithms
            )

    async def _userinfo(self, url: str, access_token: str, subject: str) -> dict[str, Any]:
        info = await self._json("GET", url, headers={"Authorization": f"Bearer {access_token}"})
        # OpenID Connect Core 5.3.2: userinfo of another subject must not be used.
        if not isinstance(info, dict) or info.get("sub") != subject:
            logger.warning("ignoring the provider's userinfo: it does not describe the ID token's subject")
            return {}
        return info

    async def logout_url(self, id_token: str | None, post_logout_redirect_uri: str) -> str | None:
        """The provider's end-session URL (RP-initiated logout) when it advertises one; None otherwise."""
        try:
            meta = await self.metadata()
        except ProviderError as exc:
            logger.warning("logging out here only: %s", exc.message)
            return None
        if not meta.end_session_endpoint:
            return None
        params = {
            "client_id": self.config.oidc_client_id,
            "post_logout_redirect_uri": post_logout_redirect_uri,
        }
        if id_token:
            params["id_token_hint"] = id_token
        sep = "&" if urlsplit(meta.end_session_endpoint).query else "?"
        return meta.end_session_endpoint + sep + urlencode(params)

    async def aclose(self) -> None:
        """Close the HTTP connections to the provider."""
        if self._http is not None:
            await self._http.close()
            self._http = None
