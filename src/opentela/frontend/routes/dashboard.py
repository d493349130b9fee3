"""The dashboard page and the read-only mesh views it draws (relayed from the ingress, never modifying it)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from opentela.errors import NotFoundError
from opentela.frontend.state import state_of

STATIC = Path(__file__).resolve().parents[1] / "static"
router = APIRouter(tags=["Dashboard"])
_MESH_VIEWS = {
    "models": "/v1/models",
    "table": "/v1/dnt/table",
    "peers": "/v1/dnt/peers",
    "stats": "/v1/dnt/stats",
    "health": "/v1/health",
}


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The single-page dashboard."""
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/api/mesh/{view}", summary="Read-only mesh views: models, table, peers, stats, health")
async def mesh_view(request: Request, view: str) -> JSONResponse:
    """The ingress's read-only endpoint of that name, as is."""
    path = _MESH_VIEWS.get(view)
    if path is None:
        raise NotFoundError(f"no mesh view {view!r}; one of {', '.join(_MESH_VIEWS)}")
    return JSONResponse(await state_of(request).ingress.get_json(path))


@router.get("/api/info", summary="The frontend's own facts")
async def info(request: Request) -> JSONResponse:
    """The ingress this frontend forwards to and its database backend."""
    st = state_of(request)
    return JSONResponse(
        {"ingress": st.ingress.base_url, "database": st.db.dialect, "instance": st.ledger.instance}
    )
