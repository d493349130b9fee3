"""Self-service for a logged-in user (session cookie): who they are, their limits, their own keys and usage."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from opentela.frontend.errors import LoginRequiredError
from opentela.frontend.keys import key_info
from opentela.frontend.login import login_of
from opentela.frontend.routes.admin import MAX_EXPIRE_DAYS
from opentela.frontend.routes.auth import same_origin
from opentela.frontend.routes.openai import usage_json
from opentela.frontend.self_service import limits_json, user_json
from opentela.frontend.sessions import LoggedIn
from opentela.frontend.state import state_of

router = APIRouter(prefix="/api/me", tags=["Self-service (login session)"])


async def current_user(request: Request) -> LoggedIn:
    """The logged-in user of the request, or 401 `login_required`."""
    me = await login_of(request).logged_in(request)
    if me is None:
        raise LoginRequiredError("log in first: this needs a login session (the dashboard's Log in button)")
    return me


CurrentUser = Annotated[LoggedIn, Depends(current_user)]
SAME_ORIGIN = [Depends(same_origin)]


class MyKeyCreate(BaseModel):
    """A key for yourself: its limits come from your group."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("", max_length=200, description="What the key is for")
    expires_in_days: float | None = Field(
        None, gt=0, le=MAX_EXPIRE_DAYS, allow_inf_nan=False, description="Days until the key stops working"
    )


@router.get("", summary="Who you are and what your group allows")
async def me(request: Request, who: CurrentUser) -> JSONResponse:
    """The logged-in user, the group whose limits apply, and how many active keys they hold."""
    users = login_of(request).users
    group, limits = await users.limits_of(who.user)
    return JSONResponse(
        {
            "user": user_json(who.user),
            "limits": limits_json(group, limits),
            "active_keys": await users.active_keys(who.user.id),
            "session_expires_at": who.expires_at,
        }
    )


@router.get("/keys", summary="Your keys")
async def my_keys(request: Request, who: CurrentUser) -> JSONResponse:
    """Every key you made, newest first (prefixes only)."""
    return JSONResponse(
        {"data": [key_info(k) for k in await state_of(request).keys.list(owner_id=who.user.id)]}
    )


@router.post(
    "/keys",
    status_code=201,
    summary="Create a key (its secret is shown only in this answer)",
    dependencies=SAME_ORIGIN,
)
async def create_my_key(request: Request, body: MyKeyCreate, who: CurrentUser) -> JSONResponse:
    """A new key with your group's limits; 403 `key_limit_reached` when you hold as many as it allows."""
    expires = time.time() + body.expires_in_days * 86400 if body.expires_in_days is not None else None
    key, secret, group = await login_of(request).users.create_key(who.user, body.name, expires)
    return JSONResponse({"key": key_info(key), "secret": secret, "group": group}, status_code=201)


@router.post(
    "/keys/{key_id}/rotate",
    summary="Give one of your keys a new secret (the old one stops working)",
    dependencies=SAME_ORIGIN,
)
async def rotate_my_key(request: Request, key_id: str, who: CurrentUser) -> JSONResponse:
    """Rotate your key: same settings and history, a new secret shown only here. Others' keys answer 404."""
    key, secret = await state_of(request).keys.rotate(key_id, owner_id=who.user.id)
    return JSONResponse({"key": key_info(key), "secret": secret})


@router.post("/keys/{key_id}/revoke", summary="Revoke one of your keys at once", dependencies=SAME_ORIGIN)
async def revoke_my_key(request: Request, key_id: str, who: CurrentUser) -> JSONResponse:
    """Revoke your key: it answers 401 from now on. Others' keys answer 404."""
    return JSONResponse(key_info(await state_of(request).keys.revoke(key_id, owner_id=who.user.id)))


@router.get("/usage", summary="Usage of all your keys")
async def my_usage(request: Request, who: CurrentUser, hours: int = 24, limit: int = 50) -> JSONResponse:
    """Tokens and requests per time bucket over the last `hours`, and the latest requests, over all your keys."""
    st = state_of(request)
    keys = await st.keys.list(owner_id=who.user.id)
    hours, limit = max(1, min(hours, 24 * 90)), max(1, min(limit, 500))
    bucket = 300 if hours <= 6 else 3600 if hours <= 72 else 86400
    since = time.time() - hours * 3600
    buckets: dict[int, dict[str, Any]] = {}
    rows = []
    for key in keys:  # a user holds a handful of keys
        for point in await st.ledger.series(key_id=key.id, since=since, bucket_s=bucket):
            total = buckets.setdefault(
                point["t"], {"t": point["t"], "requests": 0, "input_tokens": 0, "output_tokens": 0}
            )
            for field in ("requests", "input_tokens", "output_tokens"):
                total[field] += point[field]
        rows += [
            {**usage_json(r), "key_name": key.name, "key_prefix": key.prefix}
            for r in await st.ledger.rows(key_id=key.id, limit=limit)
        ]
    rows.sort(key=lambda r: r["started_at"], reverse=True)
    return JSONResponse(
        {
            "bucket_s": bucket,
            "series": [buckets[t] for t in sorted(buckets)],
            "rows": rows[:limit],
            "keys": len(keys),
        }
    )
