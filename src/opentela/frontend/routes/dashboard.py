"""The dashboard page and the read-only mesh views it draws (relayed from the ingress, never modifying it)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse

from opentela.errors import AuthenticationError, NotFoundError
from opentela.frontend.keys import tokens_match
from opentela.frontend.login import login_of
from opentela.frontend.state import bearer_token, state_of

STATIC = Path(__file__).resolve().parents[1] / "static"
router = APIRouter(tags=["Dashboard"])
_MESH_VIEWS = {
    "models": "/v1/models",
    "table": "/v1/dnt/table",
    "peers": "/v1/dnt/peers",
    "stats": "/v1/dnt/stats",
    "health": "/v1/health",
    "serverless": "/v1/dnt/serverless",
}


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The single-page dashboard."""
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def require_member(request: Request) -> None:
    """401 unless the request carries the admin token, an active API key or a login session: the node map
    (addresses, providers, hardware) is for the people this frontend serves, not for anyone who can reach it."""
    given = bearer_token(request)
    st = state_of(request)
    if not given:
        if await login_of(request).logged_in(request) is not None:
            return
        raise AuthenticationError(
            "the mesh views need 'Authorization: Bearer <API key or admin token>' or a login session"
        )
    if tokens_match(given, st.admin_token):
        return
    await st.keys.authenticate(given)


@router.get(
    "/api/mesh/{view}",
    summary="Read-only mesh views: models, table, peers, stats, health, serverless (an API key or the admin token)",
    dependencies=[Depends(require_member)],
)
async def mesh_view(request: Request, view: str) -> JSONResponse:
    """The ingress's read-only endpoint of that name, as is."""
    path = _MESH_VIEWS.get(view)
    if path is None:
        raise NotFoundError(f"no mesh view {view!r}; one of {', '.join(_MESH_VIEWS)}")
    return JSONResponse(await state_of(request).ingress.get_json(path))


@router.get("/api/info", summary="The frontend's own facts")
async def info(request: Request) -> JSONResponse:
    """The ingress this frontend forwards to, its database backend, and whether users can log in."""
    st = state_of(request)
    return JSONResponse(
        {
            "ingress": st.ingress.base_url,
            "database": st.db.dialect,
            "instance": st.ledger.instance,
            "login": login_of(request).oidc is not None,
        }
    )
