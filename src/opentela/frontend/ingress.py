"""The frontend's client of the ingress node: one keep-alive pool, OpenAI errors when the ingress is away."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from opentela.errors import OpenTelaError


class IngressUnavailableError(OpenTelaError):
    """The ingress node did not answer."""

    status_code = 502
    error_type = "upstream_error"
    code = "ingress_unreachable"
    retryable = True


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

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST to the ingress; the caller reads and releases the response."""
        try:
            return await self.session.post(
                self.base_url + path, data=body, headers={"Content-Type": "application/json", **headers}
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise IngressUnavailableError(f"the ingress at {self.base_url} is unreachable: {exc!r}") from exc

    async def aclose(self) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None
