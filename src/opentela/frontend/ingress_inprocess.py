"""The ingress in the same process: a frontend started with `otela start --ingress --frontend` hands each admitted
request to the gateway's forwarder directly instead of over loopback HTTP.

The answer is the one the gateway's HTTP route would give, byte for byte: the same status, the same headers
(request id, serving node, session, provider, Server-Timing when enabled), the same OpenAI error JSON when no replica
can serve, and for a stream the same events, resumed on another replica when one breaks and ended by an error event
when it cannot resume. A request for a serverless model with no replica waits for a cold start the same way, and one
for a split model goes to that route. A stream is relayed through a one-chunk hand-off, so a slow client still
holds back the engine as it does over HTTP. Read-only endpoints (model list, mesh tables) still go over HTTP: they
are not on the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from opentela import openai_edge as edge
from opentela.errors import OpenTelaError, RequestTooLargeError
from opentela.frontend.ingress import HttpUpstreamResponse, IngressClient
from opentela.gateway.call import Call
from opentela.gateway.routes.inference import SplitModel, accept_or_hold, answer_headers
from opentela.gateway.state import GatewayState

logger = logging.getLogger(__name__)


class WholeAnswer:
    """An answer whose body is complete (JSON, or an error)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self._body = body

    def __repr__(self) -> str:
        return f"<WholeAnswer {self.status} {len(self._body)} bytes>"

    async def read(self) -> bytes:
        """The body."""
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as one chunk."""
        yield self._body

    def release(self) -> None:
        """Nothing to release."""


class StreamedAnswer:
    """An event stream relayed from the gateway's forwarder as the frontend reads it."""

    def __init__(self, state: GatewayState, call: Call, first: bytes, headers: Mapping[str, str]) -> None:
        self.status = 200 if call.attempt is None or call.attempt.head is None else call.attempt.head.status
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self._state, self._call, self._first = state, call, first
        self._pump: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<StreamedAnswer {self._call.request_id}>"

    async def read(self) -> bytes:
        """The whole stream."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The events as the serving node sends them."""
        handoff: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1)
        self._pump = asyncio.create_task(self._relay(handoff), name=f"relay-{self._call.request_id}")
        try:
            while (chunk := await handoff.get()) is not None:
                yield chunk
        finally:
            self.release()

    async def _relay(self, handoff: asyncio.Queue[bytes | None]) -> None:
        forwarder, call = self._state.forwarder, self._call
        try:
            err = await forwarder.relay(call, self._first, handoff.put)
        except asyncio.CancelledError as exc:
            forwarder.client_gone(call)
            self._close(exc)
            raise
        except Exception as exc:
            logger.exception("relaying stream %s failed", call.request_id)
            self._close(exc)
            err = OpenTelaError("internal error")
        else:
            self._close(None)
        if err is not None:
            await handoff.put(edge.sse_error_event(err))
        await handoff.put(None)

    def _close(self, exc: BaseException | None) -> None:
        if not self._closed:
            self._closed = True
            self._call.__exit__(type(exc) if exc is not None else None, exc, None)

    def release(self) -> None:
        """Stop relaying if the reader left early: the serving node hears it, and the request is booked."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
        elif self._pump is None:
            self._state.forwarder.client_gone(self._call)
            self._close(asyncio.CancelledError())


def _error_answer(err: OpenTelaError, request_id: str) -> WholeAnswer:
    status, headers, body = edge.render_error(err, request_id)
    return WholeAnswer(status, {**headers, "Content-Type": edge.JSON_CONTENT_TYPE}, body)


class InProcessIngress:
    """The gateway of this process as the frontend's ingress (see the module's docstring)."""

    def __init__(self, state: GatewayState, http: IngressClient) -> None:
        self.state = state
        self.http = http
        self.base_url = http.base_url

    def __repr__(self) -> str:
        return f"<InProcessIngress {self.base_url}>"

    async def post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> WholeAnswer | StreamedAnswer | HttpUpstreamResponse:
        """Run one inference request through the gateway's forwarder; errors come back as answers."""
        arrived = time.perf_counter()
        request_id = edge.request_id(headers.get(edge.REQUEST_ID_HEADER))
        if len(body) > self.state.config.max_body_bytes:
            return _error_answer(
                RequestTooLargeError(
                    f"request body too large: over {self.state.config.max_body_bytes} bytes"
                ),
                request_id,
            )
        forwarder = self.state.forwarder
        try:
            call = await accept_or_hold(self.state, request_id, path, body, CIMultiDict(headers), arrived)
        except SplitModel:
            return await self.http.post(
                path, body, headers
            )  # its chain client runs behind the gateway's route
        except OpenTelaError as err:
            return _error_answer(err, request_id)
        except Exception:
            logger.exception("unhandled error accepting request %s", request_id)
            return _error_answer(OpenTelaError("internal error"), request_id)
        try:
            first = await forwarder.dispatch(call)
            attempt = call.attempt
            assert attempt is not None and attempt.head is not None
            answer = answer_headers(call, self.state.config.server_timing)
            if attempt.event_stream:
                answer["Content-Type"] = edge.SSE_CONTENT_TYPE
                answer["Cache-Control"] = "no-cache"
                return StreamedAnswer(self.state, call, first, answer)
            answer["Content-Type"] = attempt.head.headers.get("content-type", edge.JSON_CONTENT_TYPE)
            call.__exit__(None, None, None)
            return WholeAnswer(attempt.head.status, answer, first)
        except OpenTelaError as err:
            call.__exit__(type(err), err, None)
            return _error_answer(err, request_id)
        except BaseException as exc:
            call.__exit__(type(exc), exc, None)
            if isinstance(exc, Exception):
                logger.exception("unhandled error forwarding request %s", request_id)
                return _error_answer(OpenTelaError("internal error"), request_id)
            raise

    async def get_json(self, path: str) -> Any:
        """GET a read-only endpoint of the gateway over HTTP."""
        return await self.http.get_json(path)

    async def aclose(self) -> None:
        """Close the HTTP pool (the gateway belongs to the node)."""
        with contextlib.suppress(Exception):
            await self.http.aclose()
