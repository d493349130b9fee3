"""POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses: frame the forwarder's answer as
HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from aiohttp import web

from opentela import openai_edge as edge
from opentela.errors import ModelNotFoundError, NoHealthyReplicaError
from opentela.gateway.call import Call
from opentela.gateway.routes.split import handle_split
from opentela.gateway.state import CALL_KEY, REQUEST_ID_KEY, GatewayState, state_of

SERVED_MODEL_HEADER = "X-Otela-Model"
"""The id of the model that served the request (an alias's target), for usage accounting."""


def answer_headers(call: Call, server_timing: bool) -> dict[str, str]:
    """The headers of an answer: the request id, the model, node, session and provider that served it,
    timings."""
    attempt = call.attempt
    assert attempt is not None
    target = attempt.target
    headers = {
        edge.RESPONSE_ID_HEADER: call.request_id,
        edge.REQUEST_ID_HEADER: call.request_id,
        "X-Otela-Node": target.peer_id,
        "X-Otela-Session": target.session_id,
        "X-Otela-Provider": target.provider_id,
        SERVED_MODEL_HEADER: call.model,
    }
    if server_timing:
        headers["Server-Timing"] = call.server_timing()
    return headers


class AnswerWriter(Protocol):
    """Where an inference answer goes: aiohttp's response objects, or the gateway's own HTTP edge
    (gateway/fast_edge.py). Each method raises ConnectionResetError once the client is gone."""

    async def whole(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """Send a complete answer."""

    async def start(self, status: int, headers: dict[str, str]) -> None:
        """Send the head of an event stream."""

    async def write(self, chunk: bytes) -> None:
        """Send one piece of the event stream, waiting while the client's socket is full."""

    async def end(self) -> None:
        """Finish the event stream."""


class SplitModel(Exception):
    """The request names a model whose blocks are spread over block servers: the chain client serves it."""

    def __init__(self, raw: bytes, model: str) -> None:
        super().__init__(model)
        self.raw, self.model = raw, model


async def accept_or_hold(
    st: GatewayState, request_id: str, path: str, raw: bytes, headers: Mapping[str, str], arrived: float
) -> Call:
    """The forwarder's call for a request; for a serverless model with no live replica, once a controller has
    started one (gateway/hold.py). Raises SplitModel for a split model, else the client's error."""
    try:
        return st.forwarder.accept(request_id, path, raw, headers, arrived)
    except (ModelNotFoundError, NoHealthyReplicaError) as no_replica:
        model = st.forwarder.model_of(raw)
        if model in st.split.served():
            raise SplitModel(raw, model) from None
        if not st.hold.may_hold():
            raise
        await st.hold.wait(model, no_replica)
        return st.forwarder.accept(request_id, path, raw, headers, arrived)


async def serve_inference(
    st: GatewayState,
    request_id: str,
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    arrived: float,
    out: AnswerWriter,
    on_call: Callable[[Call], None],
) -> None:
    """Forward one OpenAI inference request to a replica chosen by the routing policy and write the answer to
    `out`; raises SplitModel for a split model, and the client's OpenTelaError when nothing may serve it."""
    forwarder = st.forwarder
    call = await accept_or_hold(st, request_id, path, raw, headers, arrived)
    on_call(call)
    with call:
        body = await forwarder.dispatch(call)
        attempt = call.attempt
        assert attempt is not None and attempt.head is not None
        answer = answer_headers(call, st.config.server_timing)
        if not attempt.event_stream:
            status = attempt.head.status
            # An error answer is OpenAI error JSON by now (`engine_error_body`), whatever the engine sent.
            answer["Content-Type"] = (
                edge.JSON_CONTENT_TYPE
                if status >= 400
                else attempt.head.headers.get("content-type", edge.JSON_CONTENT_TYPE)
            )
            # Written inside `with call`, so that the client has its answer before the call's bookkeeping
            # (metrics, policy feedback) runs on leaving it.
            try:
                await out.whole(attempt.head.status, answer, body)
            except ConnectionResetError:
                forwarder.client_gone(call)
            return
        answer["Content-Type"] = edge.SSE_CONTENT_TYPE
        answer["Cache-Control"] = "no-cache"
        try:
            await out.start(attempt.head.status, answer)
            err = await forwarder.relay(call, body, out.write)
            if err is not None:
                await out.write(edge.sse_error_event(err))
            await out.end()
        except ConnectionResetError:
            forwarder.client_gone(call)


class _AiohttpAnswer:
    """AnswerWriter over aiohttp's response objects."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def whole(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.response = web.Response(status=status, body=body, headers=headers)
        await self.response.prepare(self.request)
        await self.response.write_eof()

    async def start(self, status: int, headers: dict[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()


async def handle_inference(request: web.Request) -> web.StreamResponse:
    """Forward one OpenAI inference request to a replica chosen by the routing policy (connections handed over
    to aiohttp by the gateway's own HTTP edge come here)."""
    arrived = time.perf_counter()
    raw = await request.read()
    out = _AiohttpAnswer(request)

    def keep(call: Call) -> None:
        request[CALL_KEY] = call

    try:
        await serve_inference(
            state_of(request), request[REQUEST_ID_KEY], request.path, raw, request.headers, arrived, out, keep
        )
    except SplitModel as split:
        return await handle_split(request, split.raw, split.model)
    assert out.response is not None
    return out.response
