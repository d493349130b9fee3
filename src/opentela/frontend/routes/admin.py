"""Management endpoints (admin token): keys and the usage of everyone, including the trace export and the
workload statistics; the limits of self-service users per group, and the users who logged in."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from opentela.errors import InvalidRequestError, NotFoundError
from opentela.frontend.errors import AdminRequiredError
from opentela.frontend.keys import MAX_EXPIRES_AT, MAX_LIMIT, KeySettings, key_info, tokens_match
from opentela.frontend.limits import GroupLimits
from opentela.frontend.login import login_of
from opentela.frontend.routes.openai import usage_json
from opentela.frontend.self_service import limits_json, user_json
from opentela.frontend.state import bearer_token, state_of
from opentela.frontend.workload import workload


async def require_admin(request: Request) -> None:
    """401 unless the request carries the admin token."""
    given = bearer_token(request)
    if not given or not tokens_match(given, state_of(request).admin_token):
        raise AdminRequiredError("this endpoint needs 'Authorization: Bearer <admin token>'")


MAX_EXPIRE_DAYS = 36500.0
"""A key may be made to expire at most a hundred years ahead."""

router = APIRouter(prefix="/admin", tags=["Management (admin token)"], dependencies=[Depends(require_admin)])


class KeyCreate(BaseModel):
    """Settings of a new key; every limit is optional."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("", max_length=200, description="Who or what the key is for")
    # Bounded and finite: JSON from Python accepts NaN and Infinity, which no key can expire at.
    expires_at: float | None = Field(
        None,
        gt=0,
        le=MAX_EXPIRES_AT,
        allow_inf_nan=False,
        description="Unix time after which the key stops working",
    )
    expires_in_days: float | None = Field(
        None, gt=0, le=MAX_EXPIRE_DAYS, allow_inf_nan=False, description="Alternative to expires_at"
    )
    budget_tokens: int | None = Field(
        None, ge=0, le=MAX_LIMIT, description="Tokens (input + output) per budget period"
    )
    budget_requests: int | None = Field(None, ge=0, le=MAX_LIMIT, description="Requests per budget period")
    budget_period: str = Field("month", description="day, week, month (UTC calendar) or total")
    rpm_limit: int | None = Field(None, ge=0, le=MAX_LIMIT, description="Requests per minute")
    tpm_limit: int | None = Field(None, ge=0, le=MAX_LIMIT, description="Tokens per minute")
    allowed_models: list[str] | None = Field(None, description="Models the key may use (null: all)")
    trusted_providers: list[str] | None = Field(
        None, description="Default trust allowlist of providers sent to the gateway (null: any provider)"
    )
    log_content: bool = Field(True, description="False: keep this key's requests out of the anonymized trace")

    def settings(self) -> KeySettings:
        """As the key store's settings."""
        expires = self.expires_at
        if expires is None and self.expires_in_days is not None:
            expires = time.time() + self.expires_in_days * 86400
        return KeySettings(
            name=self.name,
            expires_at=expires,
            budget_tokens=self.budget_tokens,
            budget_requests=self.budget_requests,
            budget_period=self.budget_period,
            rpm_limit=self.rpm_limit,
            tpm_limit=self.tpm_limit,
            allowed_models=tuple(self.allowed_models) if self.allowed_models is not None else None,
            trusted_providers=tuple(self.trusted_providers) if self.trusted_providers is not None else None,
            log_content=self.log_content,
        )


@router.post("/keys", status_code=201, summary="Create a key (its secret is shown only in this answer)")
async def create_key(request: Request, body: KeyCreate) -> JSONResponse:
    """A new key; the answer holds the secret, which is never retrievable again."""
    key, secret = await state_of(request).keys.create(body.settings())
    return JSONResponse({"key": key_info(key), "secret": secret}, status_code=201)


@router.get("/keys", summary="List keys")
async def list_keys(request: Request, owner_id: str | None = None) -> JSONResponse:
    """Every key, or one user's (`owner_id`), newest first (prefixes only)."""
    return JSONResponse({"data": [key_info(k) for k in await state_of(request).keys.list(owner_id=owner_id)]})


@router.get("/keys/{key_id}", summary="One key")
async def get_key(request: Request, key_id: str) -> JSONResponse:
    """One key by id."""
    return JSONResponse(key_info(await state_of(request).keys.get(key_id)))


@router.post("/keys/{key_id}/revoke", summary="Revoke a key at once")
async def revoke_key(request: Request, key_id: str) -> JSONResponse:
    """Revoke: the key answers 401 from now on."""
    return JSONResponse(key_info(await state_of(request).keys.revoke(key_id)))


@router.post("/keys/{key_id}/rotate", summary="Give a key a new secret (the old one stops working)")
async def rotate_key(request: Request, key_id: str) -> JSONResponse:
    """Rotate: same key, settings and history; a new secret shown only here."""
    key, secret = await state_of(request).keys.rotate(key_id)
    return JSONResponse({"key": key_info(key), "secret": secret})


@router.get("/usage", summary="Requests and tokens per key, model and day")
async def usage_aggregates(
    request: Request, key_id: str | None = None, since_day: str | None = None
) -> JSONResponse:
    """Aggregates over every key (or one)."""
    return JSONResponse(
        {"data": await state_of(request).ledger.aggregates(key_id=key_id, since_day=since_day)}
    )


@router.get("/usage/rows", summary="Latest usage rows")
async def usage_rows(request: Request, key_id: str | None = None, limit: int = 100) -> JSONResponse:
    """The newest usage rows, one per request."""
    rows = await state_of(request).ledger.rows(key_id=key_id, limit=max(1, min(limit, 5000)))
    return JSONResponse({"data": [usage_json(r) for r in rows]})


@router.get("/usage/series", summary="Tokens over time")
async def usage_series(request: Request, key_id: str | None = None, hours: int = 24) -> JSONResponse:
    """Requests and tokens per time bucket over the last `hours`."""
    hours = max(1, min(hours, 24 * 90))
    bucket = 300 if hours <= 6 else 3600 if hours <= 72 else 86400
    series = await state_of(request).ledger.series(
        key_id=key_id, since=time.time() - hours * 3600, bucket_s=bucket
    )
    return JSONResponse({"bucket_s": bucket, "data": series})


@router.get("/usage/export.csv", summary="Anonymized trace (CSV)")
async def export_csv(
    request: Request, since: float | None = None, until: float | None = None
) -> StreamingResponse:
    """The trace schema's CSV (docs/traces.md); no keys, no content, opted-out keys left out."""
    ledger = state_of(request).ledger
    return StreamingResponse(
        ledger.export_trace(since=since, until=until),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="opentela-trace.csv"'},
    )


@router.get("/workload", summary="Workload statistics of the last hour, day or week (the trace analysis)")
async def workload_stats(request: Request, window: str = "day") -> JSONResponse:
    """Tokens per model, burstiness, length percentiles and CDFs, output ratio, prefix reuse and reasoning
    latency of the window's completed requests (docs/frontend.md, Workload)."""
    return JSONResponse(await workload(state_of(request).db, window))


MAX_KEYS_PER_USER = 1000


class GroupLimitsBody(BaseModel):
    """What the members of a group may do for themselves; every per-key limit is optional (null: unlimited)."""

    model_config = ConfigDict(extra="forbid")

    max_keys: int = Field(3, ge=0, le=MAX_KEYS_PER_USER, description="Active keys a member may hold at once")
    budget_tokens: int | None = Field(
        None, ge=0, le=MAX_LIMIT, description="Each new key's tokens per period"
    )
    budget_requests: int | None = Field(
        None, ge=0, le=MAX_LIMIT, description="Each new key's requests per period"
    )
    budget_period: Literal["day", "week", "month", "total"] = Field(
        "month", description="The budgets' period"
    )
    rpm_limit: int | None = Field(None, ge=0, le=MAX_LIMIT, description="Each new key's requests per minute")
    tpm_limit: int | None = Field(None, ge=0, le=MAX_LIMIT, description="Each new key's tokens per minute")
    allowed_models: list[str] | None = Field(None, description="Models each new key may use (null: all)")

    def limits(self) -> GroupLimits:
        """As the pure limits."""
        return GroupLimits(
            max_keys=self.max_keys,
            budget_tokens=self.budget_tokens,
            budget_requests=self.budget_requests,
            budget_period=self.budget_period,
            rpm_limit=self.rpm_limit,
            tpm_limit=self.tpm_limit,
            allowed_models=tuple(self.allowed_models) if self.allowed_models is not None else None,
        )


@router.get("/groups", summary="Self-service limits per group")
async def list_groups(request: Request) -> JSONResponse:
    """Every group's limits (`*`: users none of whose groups has limits)."""
    table = await login_of(request).users.group_table()
    return JSONResponse({"data": [limits_json(name, table[name]) for name in sorted(table)]})


@router.put("/groups/{group:path}", summary="Set a group's self-service limits")
async def set_group(request: Request, group: str, body: GroupLimitsBody) -> JSONResponse:
    """Create or replace the limits of a provider group (`*` for everyone else). Keys already made keep theirs."""
    if not group or len(group) > 200:
        raise InvalidRequestError("a group name has 1 to 200 characters", param="group")
    await login_of(request).users.set_group(group, body.limits())
    return JSONResponse(limits_json(group, body.limits()))


@router.delete("/groups/{group:path}", summary="Remove a group's self-service limits")
async def delete_group(request: Request, group: str) -> JSONResponse:
    """Its members fall back to another of their groups, then `*`, then the built-in defaults."""
    if not await login_of(request).users.delete_group(group):
        raise NotFoundError(f"group {group!r} has no limits")
    return JSONResponse({"group": group, "deleted": True})


@router.get("/users", summary="Users who logged in")
async def list_users(request: Request) -> JSONResponse:
    """Every user who logged in with OpenID Connect, latest first, with their active keys."""
    users = await login_of(request).users.users()
    return JSONResponse({"data": [{**user_json(u), "active_keys": n} for u, n in users]})


@router.post("/users/{user_id}/logout", summary="End every session of a user")
async def logout_user(request: Request, user_id: str) -> JSONResponse:
    """The user's browsers are logged out at once (their keys keep working; revoke those separately)."""
    return JSONResponse(
        {"user_id": user_id, "sessions_ended": await login_of(request).sessions.end_all(user_id)}
    )
