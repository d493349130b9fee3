"""Login sessions: a signed cookie naming a server-side session row, opened at login and ended at logout.

The rows live in the database rather than in the cookie so that logging out (or an administrator) ends a session
at once, on every replica, and the old cookie is refused from then on; a self-contained signed cookie would stay
valid until it expired. The cookie holds a random secret whose SHA-256 is the row's key, like an API key, so the
table alone lets no one in; the signature lets made-up cookies be refused without a database read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select, update

from opentela.frontend.db import Database, kept_setting
from opentela.frontend.schema import User, UserSession

SESSION_COOKIE = "otela_session"
LOGIN_COOKIE = "otela_login"
SECRET_SETTING = "session_secret"
_MAX_COOKIE = 4096


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CookieSigner:
    """HMAC-SHA256 signatures of cookie values, keyed per purpose: a value signed as one cookie is refused as
    another (a session cookie never passes for a login in progress, nor the reverse)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "<CookieSigner>"

    def _mac(self, purpose: str, payload: bytes) -> bytes:
        return hmac.new(self._key, purpose.encode() + b"\0" + payload, hashlib.sha256).digest()

    def sign(self, purpose: str, payload: bytes) -> str:
        """`payload` and its signature, as cookie-safe text."""
        return _b64(payload) + "." + _b64(self._mac(purpose, payload))

    def unsign(self, purpose: str, value: str | None) -> bytes | None:
        """The payload of a value this signer signed for `purpose`; None for anything else."""
        if not value or len(value) > _MAX_COOKIE or value.count(".") != 1:
            return None
        body, mac = value.split(".")
        try:
            payload, given = _unb64(body), _unb64(mac)
        except ValueError:
            return None
        return payload if hmac.compare_digest(given, self._mac(purpose, payload)) else None


async def session_key(db: Database, configured: str = "") -> bytes:
    """The key cookies are signed with: the configured secret, else one kept in the database (made once)."""
    secret = configured or await kept_setting(db, SECRET_SETTING, lambda: secrets.token_hex(32))
    return hashlib.sha256(b"otela-session-key\0" + secret.encode()).digest()


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class LoggedIn:
    """The user behind a valid session cookie."""

    user: User
    session_hash: str
    expires_at: float


class SessionStore:
    """Session rows behind signed cookies: open at login, look up per request, end at logout."""

    def __init__(self, db: Database, signer: CookieSigner, *, hours: float) -> None:
        self.db, self.signer, self.hours = db, signer, hours

    def __repr__(self) -> str:
        return f"<SessionStore {self.hours:g} h {self.db!r}>"

    async def open(self, user_id: str, id_token: str | None, now: float | None = None) -> tuple[str, float]:
        """A new session of `user_id`: the cookie value and when it expires."""
        now = time.time() if now is None else now
        secret = secrets.token_urlsafe(32)
        expires = now + self.hours * 3600
        row = UserSession(
            id_hash=_hash(secret), user_id=user_id, created_at=now, expires_at=expires, id_token=id_token
        )
        async with self.db.session() as s, s.begin():
            s.add(row)
        return self.signer.sign(SESSION_COOKIE, secret.encode()), expires

    async def lookup(self, cookie: str | None, now: float | None = None) -> LoggedIn | None:
        """The logged-in user of a cookie; None when it is absent, forged, ended or expired."""
        secret = self.signer.unsign(SESSION_COOKIE, cookie)
        if secret is None:
            return None
        now = time.time() if now is None else now
        id_hash = _hash(secret.decode(errors="replace"))
        async with self.db.session() as s:
            found = (
                await s.execute(
                    select(UserSession, User)
                    .join(User, User.id == UserSession.user_id)
                    .where(UserSession.id_hash == id_hash)
                )
            ).first()
        if found is None:
            return None
        session, user = found
        if session.ended_at is not None or session.expires_at <= now:
            return None
        return LoggedIn(user, id_hash, session.expires_at)

    async def end(self, cookie: str | None, now: float | None = None) -> str | None:
        """End the cookie's session (idempotent); returns the login's ID token, the provider's logout hint."""
        secret = self.signer.unsign(SESSION_COOKIE, cookie)
        if secret is None:
            return None
        id_hash = _hash(secret.decode(errors="replace"))
        async with self.db.session() as s, s.begin():
            session = await s.get(UserSession, id_hash)
            if session is None:
                return None
            if session.ended_at is None:
                session.ended_at = time.time() if now is None else now
            return session.id_token

    async def end_all(self, user_id: str, now: float | None = None) -> int:
        """End every open session of a user; returns how many were open."""
        async with self.db.session() as s, s.begin():
            result = await s.execute(
                update(UserSession)
                .where(UserSession.user_id == user_id, UserSession.ended_at.is_(None))
                .values(ended_at=time.time() if now is None else now)
            )
        return int(getattr(result, "rowcount", 0) or 0)
