"""POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses: frame the forwarder's answer as
HTTP."""

from __future__ import annotations

import time

from aiohttp import web

from opentela import openai_edge as edge
from opentela.errors import ModelNotFoundError, NoHealthyReplicaError
from opentela.gateway.call import Call
from opentela.gateway.routes.split import handle_split
from opentela.gateway.state import CALL_KEY, REQUEST_ID_KEY, state_of

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
        "X-Otela-Node": target.peer_id,
        "X-Otela-Session": target.session_id,
        "X-Otela-Provider": target.provider_id,
        SERVED_MODEL_HEADER: call.model,
    }
    if server_timing:
        headers["Server-Timing"] = call.server_timing()
    return headers


async def handle_inference(request: web.Request) -> web.StreamResponse:
    """Forward one OpenAI inference request to a replica chosen by the routing policy."""
    arrived = time.perf_counter()
    st = state_of(request)
    forwarder = st.forwarder
    raw = await request.read()
    try:
        call = forwarder.accept(request[REQUEST_ID_KEY], request.path, raw, request.headers, arrived)
    except (ModelNotFoundError, NoHealthyReplicaError) as no_replica:
        model = forwarder.model_of(raw)
        if model in st.split.served():
            return await handle_split(request, raw, model)
        # A serverless model with no live replica: wait while a controller starts one (gateway/hold.py).
        if not st.hold.may_hold():
            raise
        await st.hold.wait(model, no_replica)
        call = forwarder.accept(request[REQUEST_ID_KEY], request.path, raw, request.headers, arrived)
    request[CALL_KEY] = call
    with call:
        body = await forwarder.dispatch(call)
        attempt = call.attempt
        assert attempt is not None and attempt.head is not None
        headers = answer_headers(call, st.config.server_timing)
        if not attempt.event_stream:
            headers["Content-Type"] = attempt.head.headers.get("content-type", edge.JSON_CONTENT_TYPE)
            answer = web.Response(status=attempt.head.status, body=body, headers=headers)
            # Written here rather than by aiohttp after the handler returns, so that the client has its answer
            # before the call's bookkeeping (metrics, policy feedback) runs on leaving `with call`.
            try:
                await answer.prepare(request)
                await answer.write_eof()
            except ConnectionResetError:
                forwarder.client_gone(call)
            return answer
        headers["Content-Type"] = edge.SSE_CONTENT_TYPE
        headers["Cache-Control"] = "no-cache"
        response = web.StreamResponse(status=attempt.head.status, headers=headers)
        try:
            await response.prepare(request)
            err = await forwarder.relay(call, body, response.write)
            if err is not None:
                await response.write(edge.sse_error_event(err))
            await response.write_eof()
        except ConnectionResetError:
            forwarder.client_gone(call)
        return response
