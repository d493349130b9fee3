"""Settings of the API frontend: where it listens, which ingress it forwards to, its database and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentela.cors import CorsPolicy


@dataclass(frozen=True)
class FrontendConfig:
    """How the user-facing service authenticates, meters and forwards."""

    enabled: bool = field(
        default=False,
        metadata={
            "help": "Also run the frontend inside an ingress node (`otela start --ingress --frontend`)."
        },
    )
    http: str = field(
        default="127.0.0.1:8093", metadata={"help": "HOST:PORT the frontend (API and dashboard) listens on."}
    )
    ingress: str = field(
        default="http://127.0.0.1:8092",
        metadata={"help": "Base URL of the ingress node the frontend forwards to (without /v1)."},
    )
    db: str = field(
        default="",
        metadata={
            "help": "Database URL (sqlite:///PATH or postgresql://USER@HOST/DB); empty: a SQLite file "
            "in $XDG_DATA_HOME/opentela."
        },
    )
    admin_token: str = field(
        default="",
        repr=False,  # a secret: kept out of `otela config show` and logs
        metadata={
            "help": "Bearer token of the management endpoints; empty: generated once and kept in "
            "$XDG_DATA_HOME/opentela/admin-token."
        },
    )
    instance: str = field(
        default="",
        metadata={
            "help": "Name of this frontend replica, stamped on its usage rows so a restart reconciles only its "
            "own pending rows; empty: host name and port."
        },
    )
    max_body_bytes: int = field(
        default=4 * 1024 * 1024, metadata={"help": "Largest request body accepted; larger ones get 413."}
    )
    request_timeout: float = field(
        default=900.0, metadata={"help": "Seconds a forwarded request may take before it is abandoned (504)."}
    )
    stale_pending_after: float = field(
        default=3600.0,
        metadata={
            "help": "Pending usage rows of any replica older than this many seconds are marked interrupted "
            "at start-up (a replica that never came back)."
        },
    )
    admission: str = field(
        default="auto",
        metadata={
            "help": "Where limits and budgets are decided: `memory` (no database round trip; needs a SQLite "
            "file that only this frontend serves, enforced by a lock file), `database` (a transaction per request; "
            "for several replicas on one database) or `auto` (memory on SQLite, database on PostgreSQL)."
        },
    )
    forward_early: bool = field(
        default=True,
        metadata={
            "help": "With admission through the database, send a request on while its admission is decided, for "
            "keys far from their limits: the database round trip overlaps the mesh instead of adding to it. Nothing "
            "reaches the client before the admission; a request refused after all is cancelled, so an engine may "
            "see it start (false: admit first, always)."
        },
    )
    key_cache_seconds: float = field(
        default=1.0,
        metadata={
            "help": "How long a looked-up API key is reused without asking the database again; a key revoked "
            "or rotated through another replica (or the CLI) stops working here within this bound (0: look up "
            "every request)."
        },
    )
    header_timeout: float = field(
        default=15.0,
        metadata={
            "help": "Seconds a client has to send a complete request head once its first byte arrived; "
            "slower connections are closed (slow-header floods)."
        },
    )
    keepalive_timeout: float = field(
        default=75.0,
        metadata={
            "help": "Seconds an idle client connection stays open waiting for its next request (also from "
            "connecting to the first request)."
        },
    )
    prefix_hashes: str = field(
        default="auto",
        metadata={
            "help": "How the trace's prefix hashes cut a prompt into blocks: `auto` (16 tokens each, with the "
            "model's own tokenizer where the frontend has one, SmolLM2's from its GGUF; 64-byte chunks of the "
            "rendered prompt for other models), `bytes` (64-byte chunks for every model) or `off` (none)."
        },
    )
    trace_salt: str = field(
        default="",
        repr=False,  # a secret: kept out of `otela config show` and logs
        metadata={
            "help": "Secret key of the trace's prefix hashes: prompts hash alike only under the same salt, and "
            "without it a hash cannot be tested against a guessed prompt. Empty: generated once and kept in the "
            "database, so every replica on it hashes alike."
        },
    )
    cors_origins: tuple[str, ...] = field(
        default=("*",),
        metadata={
            "help": "Origins whose browser pages may call the `/v1` API (CORS): `*` or exact origins such as "
            "`https://app.example.org`; empty: CORS off. Every origin by default: API calls carry their key in "
            "the Authorization header, which a page must set itself, never in cookies a browser would add."
        },
    )
    oidc_issuer: str = field(
        default="",
        metadata={
            "help": "Issuer URL of the OpenID Connect provider users log in with (its "
            "/.well-known/openid-configuration is read on the first login); empty: no login, API keys only."
        },
    )
    oidc_client_id: str = field(
        default="", metadata={"help": "Client id this frontend is registered under at the provider."}
    )
    oidc_client_secret: str = field(
        default="",
        repr=False,  # a secret: kept out of `otela config show` and logs
        metadata={
            "help": "Client secret, for a confidential client (sent with HTTP Basic); empty: a public client, "
            "which PKCE alone protects."
        },
    )
    oidc_redirect_url: str = field(
        default="",
        metadata={
            "help": "The callback URL registered at the provider, https://HOST/auth/callback; empty: built from the "
            "address the browser used (set it behind a reverse proxy)."
        },
    )
    oidc_scopes: tuple[str, ...] = field(
        default=("openid", "email", "profile"),
        metadata={"help": "Scopes asked for at login (openid is always included)."},
    )
    oidc_allowed_domains: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Email domains admitted (exact match of the part after @; an email the provider marks "
            "unverified never matches). With neither domains nor groups, everyone the provider authenticates."
        },
    )
    oidc_allowed_groups: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "Groups admitted (any one of them suffices; a user matching a domain is admitted too)."
        },
    )
    oidc_groups_claim: str = field(
        default="groups",
        metadata={
            "help": "Claim holding a user's groups, a list or one string; dots walk into objects "
            "(`realm_access.roles`). Read from the ID token, else from the userinfo endpoint."
        },
    )
    session_hours: float = field(
        default=12.0, metadata={"help": "How long a login lasts before the dashboard asks to log in again."}
    )
    session_secret: str = field(
        default="",
        repr=False,  # a secret: kept out of `otela config show` and logs
        metadata={
            "help": "Key that signs the login and session cookies; empty: generated once and kept in the database, "
            "so every replica on it signs alike."
        },
    )

    def __post_init__(self) -> None:
        self.cors_policy()

    def cors_policy(self) -> CorsPolicy | None:
        """The origins `cors_origins` allows (None: CORS off); a ConfigError names a malformed entry."""
        return CorsPolicy.from_setting(self.cors_origins, "frontend.cors_origins")
