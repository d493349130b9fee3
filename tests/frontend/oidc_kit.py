"""A real OpenID Connect provider for the login tests, and the login as a browser without JavaScript does it.

The provider is oidc-provider-mock's own server (discovery, JWKS, RS256 ID tokens, the authorization code flow,
userinfo and RP-initiated logout), started as a child process on 127.0.0.1 and a free port. Its authorization
page asks for the subject to log in as; the tests give each subject its claims first (PUT /users/SUB).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from opentela.cli.localmesh import free_port

CLIENT_ID = "otela-dashboard"


@dataclass
class Provider:
    """A running provider."""

    url: str
    proc: subprocess.Popen[bytes]

    async def set_user(self, sub: str, **claims: Any) -> None:
        """Give subject `sub` these claims (email, name, groups...) for its next login."""
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{self.url}/users/{sub}", json=claims) as r:
                assert r.status == 204, await r.text()


@contextlib.contextmanager
def oidc_provider() -> Iterator[Provider]:
    """Start the provider (nonces required, as a careful provider would) and stop it afterwards."""
    port = free_port()
    argv = [sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    # Its log goes to a file: a pipe nobody reads would fill up and stall the provider mid-test.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*argv, "--require-nonce", "true"], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not _answers(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"the OpenID Connect provider did not start: {tail}")
                time.sleep(0.1)
            yield Provider(url, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/.well-known/openid-configuration", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def browser_session() -> aiohttp.ClientSession:
    """An HTTP client that keeps cookies of IP-address hosts, as a browser does."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def start_login(http: aiohttp.ClientSession, frontend: str) -> str:
    """GET /auth/login: the provider's authorization URL the frontend redirects to."""
    async with http.get(frontend + "/auth/login?next=/%23keys", allow_redirects=False) as r:
        assert r.status == 303, await r.text()
        return r.headers["Location"]


async def authorize(http: aiohttp.ClientSession, authorization_url: str, sub: str) -> str:
    """Log in as `sub` on the provider's page: the callback URL it sends the browser back to."""
    async with http.get(authorization_url) as r:
        assert r.status == 200 and 'name="sub"' in await r.text()
    async with http.post(authorization_url, data={"sub": sub}, allow_redirects=False) as r:
        assert r.status in (302, 303), await r.text()
        return r.headers["Location"]


async def log_in(http: aiohttp.ClientSession, frontend: str, sub: str) -> tuple[int, str, str]:
    """The whole login of `sub`: status, Location (or page) of the callback's answer, and the callback URL."""
    callback = await authorize(http, await start_login(http, frontend), sub)
    assert urlsplit(callback).path == "/auth/callback"
    async with http.get(callback, allow_redirects=False) as r:
        return r.status, r.headers.get("Location") or await r.text(), callback


def origin(url: str) -> dict[str, str]:
    """The Origin header the dashboard's own page sends with a POST."""
    parts = urlsplit(url)
    return {"Origin": f"{parts.scheme}://{parts.netloc}"}
