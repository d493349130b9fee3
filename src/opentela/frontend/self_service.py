"""Self-service for users who log in: who they are (recorded at each login), the limits their groups give them,
and their own keys, created within those limits."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError

from opentela.frontend.db import Database
from opentela.frontend.errors import KeyLimitReachedError
from opentela.frontend.keys import KeySettings, KeyStore, new_key
from opentela.frontend.limits import GroupLimits, pick_group
from opentela.frontend.oidc_client import Identity
from opentela.frontend.schema import ApiKey, GroupLimit, User


def limits_of_row(row: GroupLimit) -> GroupLimits:
    """A stored group's limits."""
    return GroupLimits(
        max_keys=row.max_keys,
        budget_tokens=row.budget_tokens,
        budget_requests=row.budget_requests,
        budget_period=row.budget_period,
        rpm_limit=row.rpm_limit,
        tpm_limit=row.tpm_limit,
        allowed_models=tuple(row.allowed_models) if row.allowed_models is not None else None,
    )


def limits_json(group: str | None, limits: GroupLimits) -> dict[str, Any]:
    """A group's limits as the API shows them (`group` null: the built-in defaults)."""
    out: dict[str, Any] = {"group": group, **asdict(limits)}
    out["allowed_models"] = list(limits.allowed_models) if limits.allowed_models is not None else None
    return out


def user_json(user: User) -> dict[str, Any]:
    """A user as the API shows them."""
    return {
        "id": user.id,
        "issuer": user.issuer,
        "subject": user.subject,
        "email": user.email,
        "name": user.name,
        "groups": list(user.groups or []),
        "created_at": user.created_at,
        "last_login_at": user.last_login_at,
    }


def _active(now: float) -> Any:
    return (ApiKey.revoked_at.is_(None), or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))


class SelfService:
    """Users, group limits and the keys users make for themselves."""

    def __init__(self, db: Database, keys: KeyStore) -> None:
        self.db, self.keys = db, keys

    def __repr__(self) -> str:
        return f"<SelfService {self.db!r}>"

    async def record_login(self, who: Identity, now: float | None = None) -> User:
        """The user `who` is (by issuer and subject), created on their first login; email, name and groups are
        refreshed from every login."""
        now = time.time() if now is None else now
        values = {"email": who.email, "name": who.name, "groups": list(who.groups), "last_login_at": now}
        for attempt in range(2):
            try:
                async with self.db.session() as s, s.begin():
                    user = await s.scalar(
                        select(User).where(User.issuer == who.issuer, User.subject == who.subject)
                    )
                    if user is None:
                        user = User(
                            id=uuid.uuid4().hex, issuer=who.issuer, subject=who.subject, created_at=now
                        )
                        s.add(user)
                    for name, value in values.items():
                        setattr(user, name, value)
                return user
            except IntegrityError:
                if attempt:  # the same first login twice at once: the other one created the row
                    raise
        raise AssertionError("unreachable")

    async def group_table(self) -> dict[str, GroupLimits]:
        """Every group's limits."""
        async with self.db.session() as s:
            rows = (await s.scalars(select(GroupLimit))).all()
        return {row.group_name: limits_of_row(row) for row in rows}

    async def limits_of(self, user: User) -> tuple[str | None, GroupLimits]:
        """The group whose limits `user` gets, and those limits (frontend/limits.py, pick_group)."""
        return pick_group(user.groups or (), await self.group_table())

    async def active_keys(self, user_id: str, now: float | None = None) -> int:
        """How many of the user's keys work now (neither revoked nor expired)."""
        now = time.time() if now is None else now
        async with self.db.session() as s:
            count = await s.scalar(
                select(func.count()).select_from(ApiKey).where(ApiKey.owner_id == user_id, *_active(now))
            )
        return int(count or 0)

    async def create_key(
        self, user: User, name: str, expires_at: float | None = None
    ) -> tuple[ApiKey, str, str | None]:
        """A new key of `user` with their group's limits, unless they already hold as many active keys as it allows
        (KeyLimitReachedError). Returns the key, its secret and the group."""
        group, limits = await self.limits_of(user)
        settings = KeySettings(
            name=name,
            expires_at=expires_at,
            budget_tokens=limits.budget_tokens,
            budget_requests=limits.budget_requests,
            budget_period=limits.budget_period,
            rpm_limit=limits.rpm_limit,
            tpm_limit=limits.tpm_limit,
            allowed_models=limits.allowed_models,
        )
        key, secret = new_key(settings, owner_id=user.id)
        now = time.time()
        async with self.db.session() as s, s.begin():
            # Touch the user's row first: a row lock on PostgreSQL, the write lock on SQLite. Two creations of one
            # user are then counted one after the other, so together they cannot pass the limit.
            await s.execute(update(User).where(User.id == user.id).values(last_login_at=User.last_login_at))
            active = await s.scalar(
                select(func.count()).select_from(ApiKey).where(ApiKey.owner_id == user.id, *_active(now))
            )
            if int(active or 0) >= limits.max_keys:
                source = f"group {group!r}" if group else "the default"
                raise KeyLimitReachedError(
                    f"you hold {active} active keys, the most {source} allows ({limits.max_keys}); "
                    "revoke one to create another"
                )
            s.add(key)
        return key, secret, group

    async def set_group(self, group: str, limits: GroupLimits, now: float | None = None) -> None:
        """Create or replace a group's limits (keys already made keep theirs)."""
        values = {**asdict(limits), "updated_at": time.time() if now is None else now}
        values["allowed_models"] = list(limits.allowed_models) if limits.allowed_models is not None else None
        async with self.db.session() as s, s.begin():
            row = await s.get(GroupLimit, group)
            if row is None:
                s.add(GroupLimit(group_name=group, **values))
            else:
                for name, value in values.items():
                    setattr(row, name, value)

    async def delete_group(self, group: str) -> bool:
        """Remove a group's limits; False when it had none."""
        async with self.db.session() as s, s.begin():
            row = await s.get(GroupLimit, group)
            if row is None:
                return False
            await s.delete(row)
        return True

    async def users(self, now: float | None = None) -> list[tuple[User, int]]:
        """Every user who ever logged in, with how many active keys each holds, latest login first."""
        now = time.time() if now is None else now
        counts = (
            select(ApiKey.owner_id, func.count().label("n"))
            .where(ApiKey.owner_id.is_not(None), *_active(now))
            .group_by(ApiKey.owner_id)
            .subquery()
        )
        async with self.db.session() as s:
            rows = (
                await s.execute(
                    select(User, counts.c.n)
                    .outerjoin(counts, counts.c.owner_id == User.id)
                    .order_by(User.last_login_at.desc())
                )
            ).all()
        return [(user, int(n or 0)) for user, n in rows]
