"""Logging in and out with OpenID Connect: the redirect to the provider, its callback, and logout."""

from __future__ import annotations

import html
import logging
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from opentela.frontend.errors import CrossOriginError
from opentela.frontend.login import LOGIN_COOKIE_PATH, SESSION_COOKIE_PATH, Login, login_of
from opentela.frontend.oidc import LOGIN_TTL_S, LoginError, LoginFlow, LoginRefusedError, admission_refusal
from opentela.frontend.sessions import LOGIN_COOKIE, SESSION_COOKIE

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/auth", tags=["Login (OpenID Connect)"])


def same_origin(request: Request) -> None:
    """Refuse a cookie-authenticated change sent from another site's page.

    The session cookie is SameSite=Lax, which keeps it off cross-site POSTs; browsers also name the page's origin
    on every POST, and it must be this frontend: its host as the browser addressed it, or the host of the
    configured callback URL (a reverse proxy may pass on another Host). That also covers pages of sites that count
    as the same site (a sibling subdomain), which SameSite lets through.
    """
    origin = request.headers.get("origin", "")
    ours = {request.headers.get("host", "")}
    if login_of(request).config.oidc_redirect_url:
        ours.add(urlsplit(login_of(request).config.oidc_redirect_url).netloc)
    if "://" not in origin or origin.split("://", 1)[1].rstrip("/") not in ours - {""}:
        raise CrossOriginError("this request must come from the dashboard's own page (Origin does not match)")


def page(status: int, title: str, message: str) -> HTMLResponse:
    """A small page of the dashboard's style for the browser to land on (login problems, refusals)."""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - OpenTela</title><link rel="stylesheet" href="/static/app.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml"></head>
<body><main class="auth-page"><section class="panel" id="auth-message" data-status="{status}">
<h1>{html.escape(title)}</h1><p>{html.escape(message)}</p>
<p class="row"><a class="button" href="/auth/login" id="auth-retry">Log in again</a>
<a class="button ghost" href="/">Back to the dashboard</a></p></section></main></body></html>"""
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def _failed(exc: LoginError) -> HTMLResponse:
    title = "Access refused" if isinstance(exc, LoginRefusedError) else "Login failed"
    resp = page(exc.status_code, title, exc.message)
    resp.delete_cookie(LOGIN_COOKIE, path=LOGIN_COOKIE_PATH)
    return resp


def _enabled(request: Request) -> Login | None:
    lg = login_of(request)
    return lg if lg.oidc is not None else None


@router.get("/login", summary="Log in: redirects to the OpenID Connect provider")
async def login(request: Request, next: str = "/") -> Response:
    """Start a login (authorization code flow with PKCE); `next` is the dashboard page to come back to."""
    lg = _enabled(request)
    if lg is None or lg.oidc is None:
        return page(
            404, "Login is not configured", "This frontend has no OpenID Connect provider; use an API key."
        )
    try:
        url, flow = await lg.oidc.begin(next, lg.redirect_uri(request))
    except LoginError as exc:
        logger.warning("login could not start: %s", exc.message)
        return _failed(exc)
    resp = RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})
    resp.set_cookie(
        LOGIN_COOKIE,
        lg.signer.sign(LOGIN_COOKIE, flow.dumps()),
        max_age=int(LOGIN_TTL_S),
        path=LOGIN_COOKIE_PATH,
        httponly=True,
        samesite="lax",  # the provider sends the browser back with a top-level GET, which Lax cookies go with
        secure=lg.secure_cookies(request),
    )
    return resp


@router.get("/callback", name="login_callback", summary="Where the provider sends the browser back")
async def callback(request: Request) -> Response:
    """Finish the login: check state, exchange the code, verify the ID token, admit by domain or group, then open
    a session and return to the dashboard."""
    lg = _enabled(request)
    if lg is None or lg.oidc is None:
        return page(404, "Login is not configured", "This frontend has no OpenID Connect provider.")
    signed = lg.signer.unsign(LOGIN_COOKIE, request.cookies.get(LOGIN_COOKIE))
    flow = LoginFlow.loads(signed) if signed is not None else None
    try:
        who = await lg.oidc.finish(dict(request.query_params), flow, lg.redirect_uri(request))
        refusal = admission_refusal(
            who.claims,
            domains=lg.config.oidc_allowed_domains,
            groups=lg.config.oidc_allowed_groups,
            groups_claim=lg.config.oidc_groups_claim,
        )
        if refusal is not None:
            raise LoginRefusedError(refusal)
    except LoginError as exc:
        logger.info("login refused (%d): %s", exc.status_code, exc.message)
        return _failed(exc)
    assert flow is not None
    user = await lg.users.record_login(who)
    # A login always gets a new session; one this browser held before ends (no session fixation).
    await lg.sessions.end(request.cookies.get(SESSION_COOKIE))
    cookie, _ = await lg.sessions.open(user.id, who.id_token)
    logger.info("user %s logged in", user.id)
    resp = RedirectResponse(flow.next, status_code=303, headers={"Cache-Control": "no-store"})
    resp.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(lg.config.session_hours * 3600),
        path=SESSION_COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=lg.secure_cookies(request),
    )
    resp.delete_cookie(LOGIN_COOKIE, path=LOGIN_COOKIE_PATH)
    return resp


@router.post(
    "/logout",
    summary="Log out: ends the session here, and at the provider",
    dependencies=[Depends(same_origin)],
)
async def logout(request: Request) -> JSONResponse:
    """End this browser's session; `redirect` is where to send it next: the provider's end-session page when it
    has one (so the provider's own session ends too), else the dashboard."""
    lg = login_of(request)
    cookie = request.cookies.get(SESSION_COOKIE)
    ended = await lg.sessions.lookup(cookie)
    id_token = await lg.sessions.end(cookie)
    redirect = None
    if ended is not None and lg.oidc is not None:
        logger.info("user %s logged out", ended.user.id)
        redirect = await lg.oidc.logout_url(id_token, lg.public_root(request))
    resp = JSONResponse({"logged_out": ended is not None, "redirect": redirect or "/"})
    resp.delete_cookie(SESSION_COOKIE, path=SESSION_COOKIE_PATH)
    return resp
