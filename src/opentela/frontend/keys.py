"""API keys: random secrets shown once, stored as SHA-256 with a visible prefix; create, list, revoke, rotate (an
administrator any key, a logged-in user only their own)."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from opentela.errors import AuthenticationError, InvalidRequestError
from opentela.frontend.db import Database
from opentela.frontend.errors import KeyExpiredError, KeyNotFoundError, KeyRevokedError
from opentela.frontend.limits import BUDGET_PERIODS
from opentela.frontend.schema import ApiKey

KEY_SCHEME = "otela-"
PREFIX_CHARS = len(KEY_SCHEME) + 8
MAX_LIMIT = 2**62  # limits are 64-bit integers in the database
MAX_EXPIRES_AT = 253402300799.0
"""The last second of year 9999: the latest expiry a key may have (later ones cannot be rendered as dates)."""


def new_secret() -> str:
    """A fresh API key: the scheme and 256 random bits (so a fast hash is enough: nothing to brute-force)."""
    return KEY_SCHEME + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The only form of a key the database ever holds."""
    return hashlib.sha256(secret.encode()).hexdigest()


def visible_prefix(secret: str) -> str:
    """The part of a key shown in listings, enough to tell keys apart."""
    return secret[:PREFIX_CHARS]


def tokens_match(given: str, expected: str) -> bool:
    """Constant-time comparison of bearer tokens."""
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class KeySettings:
    """What a key may do; every limit is optional (None: unlimited)."""

    name: str = ""
    expires_at: float | None = None
    budget_tokens: int | None = None
    budget_requests: int | None = None
    budget_period: str = "month"
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    allowed_models: tuple[str, ...] | None = None
    trusted_providers: tuple[str, ...] | None = None
    log_content: bool = True

    def validate(self) -> KeySettings:
        """Reject impossible settings with a clear message."""
        if self.budget_period not in BUDGET_PERIODS:
            raise InvalidRequestError(
                f"budget_period must be one of {', '.join(BUDGET_PERIODS)}", param="budget_period"
            )
        for name in ("budget_tokens", "budget_requests", "rpm_limit", "tpm_limit"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LIMIT:
                raise InvalidRequestError(f"{name} must be between 0 and {MAX_LIMIT}", param=name)
        if len(self.name) > 200:
            raise InvalidRequestError("name is longer than 200 characters", param="name")
        if self.expires_at is not None and not (
            isinstance(self.expires_at, (int, float)) and 0 < self.expires_at <= MAX_EXPIRES_AT
        ):
            # NaN and infinity fail this too; they must never reach the database.
            raise InvalidRequestError(
                f"expires_at must be a Unix time between 0 and {MAX_EXPIRES_AT:.0f}", param="expires_at"
            )
        return self


def _time(value: Any) -> float | None:
    # Rows written by older versions may hold NaN or infinity, which JSON cannot carry: show them as unset.
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _names(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else None


def key_info(key: ApiKey, now: float | None = None) -> dict[str, Any]:
    """A key as the API shows it: never the secret or its hash. Renders any stored row, however odd."""
    now = time.time() if now is None else now
    expires_at = _time(key.expires_at)
    if key.revoked_at is not None:
        state = "revoked"
    elif expires_at is not None and expires_at <= now:
        state = "expired"
    else:
        state = "active"
    return {
        "id": str(key.id),
        "name": str(key.name or ""),
        "prefix": str(key.prefix or ""),
        "state": state,
        "created_at": _time(key.created_at),
        "rotated_at": _time(key.rotated_at),
        "expires_at": expires_at,
        "revoked_at": _time(key.revoked_at),
        "last_used_at": _time(key.last_used_at),
        "budget_tokens": _count(key.budget_tokens),
        "budget_requests": _count(key.budget_requests),
        "budget_period": str(key.budget_period or ""),
        "rpm_limit": _count(key.rpm_limit),
        "tpm_limit": _count(key.tpm_limit),
        "allowed_models": _names(key.allowed_models),
        "trusted_providers": _names(key.trusted_providers),
        "log_content": bool(key.log_content),
        "owner_id": str(key.owner_id) if key.owner_id else None,
    }


def new_key(settings: KeySettings, owner_id: str | None = None) -> tuple[ApiKey, str]:
    """The row of a new key with these (validated) settings, and its secret; nothing is written yet."""
    settings.validate()
    secret = new_secret()
    key = ApiKey(
        id=uuid.uuid4().hex,
        name=settings.name,
        prefix=visible_prefix(secret),
        secret_hash=hash_secret(secret),
        created_at=time.time(),
        expires_at=settings.expires_at,
        budget_tokens=settings.budget_tokens,
        budget_requests=settings.budget_requests,
        budget_period=settings.budget_period,
        rpm_limit=settings.rpm_limit,
        tpm_limit=settings.tpm_limit,
        allowed_models=list(settings.allowed_models) if settings.allowed_models is not None else None,
        trusted_providers=list(settings.trusted_providers)
        if settings.trusted_providers is not None
        else None,
        log_content=settings.log_content,
        owner_id=owner_id,
    )
    return key, secret


def _owned(key: ApiKey | None, key_id: str, owner_id: str | None) -> ApiKey:
    # Someone else's key answers exactly as a missing one: a user learns nothing about keys that are not theirs.
    if key is None or (owner_id is not None and key.owner_id != owner_id):
        raise KeyNotFoundError(f"no API key with id {key_id!r}", param="key_id")
    return key


KEY_CACHE_ENTRIES = 10_000
"""Keys remembered at most; the least recently used goes first."""


class KeyStore:
    """Key management over the database, with looked-up keys reused for `cache_seconds`.

    The cache saves a database round trip on almost every request. Revoking or rotating through this store drops the
    key from its cache at once; through another replica or the CLI it takes effect here within `cache_seconds`.
    Unknown secrets are never cached, so made-up keys cannot fill it.
    """

    def __init__(self, db: Database, *, cache_seconds: float = 0.0) -> None:
        self.db = db
        self.cache_seconds = cache_seconds
        self._cache: OrderedDict[str, tuple[ApiKey, float]] = OrderedDict()
        self.lookups = 0
        """Database lookups made by `authenticate` (the rest were answered from the cache)."""

    def _forget(self, key: ApiKey) -> None:
        self._cache.pop(key.secret_hash, None)

    async def create(self, settings: KeySettings, owner_id: str | None = None) -> tuple[ApiKey, str]:
        """A new key and its secret (the only time the secret exists outside the caller's hands)."""
        key, secret = new_key(settings, owner_id)
        async with self.db.session() as s, s.begin():
            s.add(key)
        return key, secret

    async def list(self, owner_id: str | None = None) -> list[ApiKey]:
        """Every key, or every key of one user, newest first."""
        query = select(ApiKey).order_by(ApiKey.created_at.desc())
        if owner_id is not None:
            query = query.where(ApiKey.owner_id == owner_id)
        async with self.db.session() as s:
            return list((await s.scalars(query)).all())

    async def get(self, key_id: str, owner_id: str | None = None) -> ApiKey:
        """One key by id (404 when there is none, or when `owner_id` is given and the key is someone else's)."""
        async with self.db.session() as s:
            return _owned(await s.get(ApiKey, key_id), key_id, owner_id)

    async def revoke(self, key_id: str, owner_id: str | None = None) -> ApiKey:
        """Revoke at once; requests with the key fail with 401 from now on. Idempotent. With `owner_id`, only that
        user's key (another's answers 404, as if it did not exist)."""
        async with self.db.session() as s, s.begin():
            key = _owned(await s.get(ApiKey, key_id), key_id, owner_id)
            if key.revoked_at is None:
                key.revoked_at = time.time()
        self._forget(key)
        return key

    async def rotate(self, key_id: str, owner_id: str | None = None) -> tuple[ApiKey, str]:
        """A new secret for the same key (settings and usage history stay); the old secret stops working. With
        `owner_id`, only that user's key."""
        secret = new_secret()
        async with self.db.session() as s, s.begin():
            key = _owned(await s.get(ApiKey, key_id), key_id, owner_id)
            if key.revoked_at is not None:
                raise KeyRevokedError("a revoked key cannot be rotated; create a new one")
            self._forget(key)
            key.prefix, key.secret_hash, key.rotated_at = (
                visible_prefix(secret),
                hash_secret(secret),
                time.time(),
            )
        return key, secret

    async def authenticate(self, secret: str | None, now: float | None = None) -> ApiKey:
        """The active key behind a bearer secret, or the reason it is refused."""
        if not secret:
            raise AuthenticationError(
                "no API key: send it as 'Authorization: Bearer otela-...' (create one with `otela keys create`)"
            )
        if not secret.startswith(KEY_SCHEME):
            raise AuthenticationError("invalid API key: OpenTela keys start with 'otela-'")
        key = await self._lookup(hash_secret(secret))
        if key is None:
            # Never echo any part of what was sent: it may be a real secret with a typo, and errors are logged.
            raise AuthenticationError("invalid API key: no such key")
        now = time.time() if now is None else now
        if key.revoked_at is not None:
            raise KeyRevokedError(f"API key {key.id} was revoked")
        if key.expires_at is not None and key.expires_at <= now:
            raise KeyExpiredError(f"API key {key.id} expired at {_iso(key.expires_at)}")
        return key

    async def _lookup(self, secret_hash: str) -> ApiKey | None:
        """The key with this hash: from the cache while fresh, else from the database (and cached)."""
        now = time.monotonic()
        cached = self._cache.get(secret_hash)
        if cached is not None and now - cached[1] < self.cache_seconds:
            self._cache.move_to_end(secret_hash)
            return cached[0]
        self.lookups += 1
        async with self.db.session() as s:
            key = await s.scalar(select(ApiKey).where(ApiKey.secret_hash == secret_hash))
        if key is None:
            self._cache.pop(secret_hash, None)
        elif self.cache_seconds > 0:
            self._cache[secret_hash] = (key, now)
            self._cache.move_to_end(secret_hash)
            if len(self._cache) > KEY_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return key


def _iso(ts: float) -> str:
    if not math.isfinite(ts) or not 0 <= ts <= MAX_EXPIRES_AT:
        return "an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
