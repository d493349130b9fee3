"""What logging in needs at request time: the provider, the cookie signer, the session store and self-service."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from opentela.errors import ConfigError
from opentela.frontend._config import FrontendConfig
from opentela.frontend.db import Database
from opentela.frontend.keys import KeyStore
from opentela.frontend.oidc_client import OidcClient
from opentela.frontend.self_service import SelfService
from opentela.frontend.sessions import SESSION_COOKIE, CookieSigner, LoggedIn, SessionStore, session_key

SESSION_COOKIE_PATH = "/"
LOGIN_COOKIE_PATH = "/auth/"


def check_login_config(config: FrontendConfig) -> None:
    """Refuse a half-configured login at start-up rather than at the first user's login."""
    if not config.oidc_issuer:
        return
    issuer = urlsplit(config.oidc_issuer)
    if issuer.scheme not in ("https", "http") or not issuer.netloc:
        raise ConfigError(f"frontend.oidc_issuer must be an http(s) URL, not {config.oidc_issuer!r}")
    if not config.oidc_client_id:
        raise ConfigError("frontend.oidc_issuer is set but frontend.oidc_client_id is not")
    if config.oidc_redirect_url and not urlsplit(config.oidc_redirect_url).path.endswith("/auth/callback"):
        raise ConfigError("frontend.oidc_redirect_url must be this frontend's /auth/callback URL")
    if not config.session_hours > 0:
        raise ConfigError("frontend.session_hours must be positive")


@dataclass
class Login:
    """The frontend's login: `oidc` is None when no provider is configured (self-service then has no users, but
    administrators can already set group limits)."""

    config: FrontendConfig
    oidc: OidcClient | None
    signer: CookieSigner
    sessions: SessionStore
    users: SelfService

    @classmethod
    async def create(cls, config: FrontendConfig, db: Database, keys: KeyStore) -> Login:
        """Check the settings and read (or make) the cookie key; nothing is asked of the provider yet."""
        check_login_config(config)
        signer = CookieSigner(await session_key(db, config.session_secret))
        return cls(
            config=config,
            oidc=OidcClient(config) if config.oidc_issuer else None,
            signer=signer,
            sessions=SessionStore(db, signer, hours=config.session_hours),
            users=SelfService(db, keys),
        )

    def redirect_uri(self, request: Request) -> str:
        """The callback URL: configured, else this frontend's own as the browser reached it."""
        return self.config.oidc_redirect_url or str(request.url_for("login_callback"))

    def public_root(self, request: Request) -> str:
        """This frontend's root URL as users see it (where the provider sends them after logging out)."""
        parts = urlsplit(self.redirect_uri(request))
        return f"{parts.scheme}://{parts.netloc}/"

    def secure_cookies(self, request: Request) -> bool:
        """Whether cookies get `Secure`: when the browser talks https to us (directly or through a proxy, which the
        configured https callback URL tells)."""
        return request.url.scheme == "https" or self.redirect_uri(request).startswith("https://")

    async def logged_in(self, request: Request) -> LoggedIn | None:
        """The user of the request's session cookie, if it is valid."""
        return await self.sessions.lookup(request.cookies.get(SESSION_COOKIE))

    async def aclose(self) -> None:
        """Close the connections to the provider."""
        if self.oidc is not None:
            await self.oidc.aclose()


def login_of(request: Request) -> Login:
    """The login of the app serving `request`."""
    return request.app.state.login
