"""The frontend's way to the ingress: what an upstream answer looks like, and the HTTP client of a separate
ingress (one keep-alive pool, OpenAI errors when the ingress is away). The in-process way, for a frontend running
inside the ingress node, is frontend/ingress_inprocess.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp

from opentela.errors import OpenTelaError, UpstreamTimeout


class IngressUnavailableError(OpenTelaError):
    """The ingress node did not answer."""

    status_code = 502
    error_type = "upstream_error"
    code = "ingress_unreachable"
    retryable = True


class UpstreamResponse(Protocol):
    """An answer of the ingress: status and headers at once, then the body whole or chunk by chunk.

    Reading raises an `OpenTelaError` when the answer breaks off; `release` must be called once it is done with.
    """

    @property
    def status(self) -> int:
        """The HTTP status."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers, case-insensitive."""
        ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        ...

    def release(self) -> None:
        """Done with the answer (an unread rest is dropped, which tells the serving node the client left)."""
        ...


class Ingress(Protocol):
    """Where the frontend sends admitted requests, and reads the mesh's read-only endpoints."""

    base_url: str

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Send one inference request; errors the ingress answers with come back as responses."""
        ...

    async def get_json(self, path: str) -> Any:
        """GET a read-only endpoint of the ingress as JSON."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def broken_off(exc: BaseException) -> OpenTelaError:
    """What the client is told when the ingress's answer broke off after it started."""
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"the ingress did not finish the response in time: {exc!r}")
    return IngressUnavailableError(f"the ingress broke off the response: {exc!r}")


class HttpUpstreamResponse:
    """An aiohttp response of the ingress as an `UpstreamResponse`."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers = response.headers

    def __repr__(self) -> str:
        return f"<HttpUpstreamResponse {self.status}>"

    async def read(self) -> bytes:
        """The whole body."""
        try:
            return await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise broken_off(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise broken_off(exc) from exc

    def release(self) -> None:
        """Return the connection to the pool (or close it, with an unread rest)."""
        self._response.release()


class IngressClient:
    """Talks HTTP to one ingress node (the OpenAI routes and the read-only infrastructure endpoints)."""

    def __init__(
        self, base_url: str, *, request_timeout: float = 900.0, connect_timeout: float = 10.0
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"<IngressClient {self.base_url}>"

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled client session, created on first use inside the running loop."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, auto_decompress=False, connector=aiohttp.TCPConnector(limit=0)
            )
        return self._session

    async def get_json(self, path: str) -> Any:
        """GET a read-only endpoint of the ingress as JSON."""
        try:
            async with self.session.get(
                self.base_url + path, timeout=aiohttp.ClientTimeout(total=15)
            ) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise IngressUnavailableError(
                        f"the ingress answered {path} with {resp.status}: {text[:200]}"
                    )
                return json.loads(text)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise IngressUnavailableError(
                f"the ingress at {self.base_url} did not answer {path}: {exc!r}"
            ) from exc

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> HttpUpstreamResponse:
        """POST to the ingress; the caller reads and releases the response."""
        try:
            response = await self.session.post(
                self.base_url + path, data=body, headers={"Content-Type": "application/json", **headers}
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise IngressUnavailableError(f"the ingress at {self.base_url} is unreachable: {exc!r}") from exc
        return HttpUpstreamResponse(response)

    async def aclose(self) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None
