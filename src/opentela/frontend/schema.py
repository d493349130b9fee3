"""The frontend's tables: API keys (hashes only), one usage row per request, per-key budget and rate counters,
the frontend's own settings, and the users who log in with OpenID Connect, their sessions and their groups' limits."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of the frontend schema."""


class ApiKey(Base):
    """An API key: the secret is never stored, only its SHA-256 and a short visible prefix."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(32))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    rotated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_requests: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_period: Mapped[str] = mapped_column(String(16), default="month")
    rpm_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tpm_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    trusted_providers: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    log_content: Mapped[bool] = mapped_column(Boolean, default=True)
    owner_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id"), nullable=True, index=True
    )
    """The user who made the key for themselves (frontend/self_service.py); null for keys an administrator made."""


class UsageRow(Base):
    """One request: written as `pending` before forwarding, completed in the code path that ends the response."""

    __tablename__ = "usage"
    __table_args__ = (
        Index("ix_usage_key_started", "key_id", "started_at"),
        Index("ix_usage_status_instance", "status", "instance"),
        Index("ix_usage_day", "day"),
        Index("ix_usage_status_started", "status", "started_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[str] = mapped_column(String(32), ForeignKey("api_keys.id"))
    instance: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(300))
    stream: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    provider: Mapped[str | None] = mapped_column(String(200), nullable=True)
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    tokens_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    day: Mapped[str] = mapped_column(String(10))
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    sampling: Mapped[dict | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    prefix_hashes: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """The hashes of the prompt's blocks (frontend/prefix_hashes.py), 8 bytes each back to back, written after the
    response; null for keys that opted out of the trace, for embeddings and where nothing was hashed."""
    reasoning: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """Whether the answer reasoned before it answered (reasoning text, or a leading <think>); null: unknown."""


class UsageCounter(Base):
    """What a key with a budget used in one budget period: the sum of its usage rows started in that period.

    Written in the same transaction as the rows it sums, so it equals them at every commit; admission reads one
    counter instead of summing the period's rows (which grew with the key's history).
    """

    __tablename__ = "usage_counters"

    key_id: Mapped[str] = mapped_column(String(32), ForeignKey("api_keys.id"), primary_key=True)
    period: Mapped[str] = mapped_column(String(16), primary_key=True)
    start: Mapped[float] = mapped_column(Float, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageRate(Base):
    """What a key started in one second of the rate window: requests and their tokens (estimated, then final).

    A ring of RATE_SLOTS rows per key (slot = second mod RATE_SLOTS): a new second takes over the slot of one that
    left the window, so the table never grows and admission sums at most RATE_SLOTS rows, however fast the key is
    used. Kept next to the usage rows it sums, like the budget counters.
    """

    __tablename__ = "usage_rate"

    key_id: Mapped[str] = mapped_column(String(32), ForeignKey("api_keys.id"), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    second: Mapped[int] = mapped_column(BigInteger)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class FrontendSetting(Base):
    """A value the frontend keeps for itself, shared by every replica on the database (the trace's salt)."""

    __tablename__ = "frontend_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class User(Base):
    """Someone who logged in through the OpenID Connect provider: known by the provider's issuer and subject."""

    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("issuer", "subject", name="uq_users_issuer_subject"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    issuer: Mapped[str] = mapped_column(String(500))
    subject: Mapped[str] = mapped_column(String(255))
    email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    groups: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    """The groups the provider named at the last login (the configured claim)."""
    created_at: Mapped[float] = mapped_column(Float)
    last_login_at: Mapped[float] = mapped_column(Float)


class UserSession(Base):
    """A logged-in browser: the cookie holds a random secret, the table only its SHA-256 (like API keys)."""

    __tablename__ = "user_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(32), ForeignKey("users.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    id_token: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The provider's ID token of the login, sent back as the hint when the user logs out there too."""


class GroupLimit(Base):
    """What the members of one provider group may do for themselves: how many keys, and each new key's limits.

    The group `*` applies to users none of whose groups has a row.
    """

    __tablename__ = "group_limits"

    group_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    max_keys: Mapped[int] = mapped_column(Integer)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_requests: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    budget_period: Mapped[str] = mapped_column(String(16), default="month")
    rpm_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tpm_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


USAGE_STATUSES = ("pending", "ok", "error", "cancelled", "interrupted")
