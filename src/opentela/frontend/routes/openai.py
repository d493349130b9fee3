"""The OpenAI-compatible surface: authenticate the key, validate, admit against its limits, forward and meter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from opentela.errors import InvalidRequestError, RequestTooLargeError
from opentela.frontend.errors import ModelNotAllowedError
from opentela.frontend.keys import key_info
from opentela.frontend.metering import abandon, forward, forward_early, plan_forward
from opentela.frontend.schema import ApiKey
from opentela.frontend.state import FrontendState, bearer_token, state_of
from opentela.frontend.token_counts import sampling_params
from opentela.openai_edge import INFERENCE_PATHS, estimate_input_tokens, parse_body, validate

logger = logging.getLogger(__name__)
router = APIRouter(tags=["OpenAI-compatible API"])

TRUST_HEADER = "X-Otela-Trusted-Providers"
ROUTING_HEADERS = ("X-Otela-Require", "X-Otela-Policy", "X-Otela-Resume")
"""Client headers the ingress acts on that the frontend passes through unchanged; the ingress checks them."""


def _body_doc(required: list[str], example: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "additionalProperties": True, "example": example}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def authenticate(request: Request) -> ApiKey:
    """The active key of the request, or 401 with the reason."""
    return await state_of(request).keys.authenticate(bearer_token(request))


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes (413) without reading further."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def trusted_providers(key: ApiKey, asked: str | None) -> list[str] | None:
    """The trust allowlist to send: the key's default, narrowed (never widened) by the client's own header."""
    wanted = [p.strip() for p in asked.split(",") if p.strip()] if asked else None
    if key.trusted_providers is None:
        return wanted
    if wanted is None:
        return list(key.trusted_providers)
    narrowed = [p for p in wanted if p in key.trusted_providers]
    if not narrowed:
        raise InvalidRequestError(
            f"none of the providers in {TRUST_HEADER} is allowed for this key "
            f"(allowed: {', '.join(key.trusted_providers)})",
            param=TRUST_HEADER,
        )
    return narrowed


CLIENT_CLOSED_REQUEST = 499
"""What the access log shows for a request whose client left before its answer (nobody receives it)."""


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, Response]) -> Response | None:
    """`work`'s response, or None when the client disconnected first; then `work` is cancelled.

    Starlette cancels a streaming body when its client leaves but not an endpoint still waiting for its
    answer; cancelling here closes the connection to the ingress, which resets the mesh stream, which makes
    the serving node close its engine request: the engine stops generating for nobody.
    """
    answer = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((answer, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        answer.cancel()
        raise
    finally:
        watcher.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await answer
    return None


async def _inference(request: Request) -> Response:
    st: FrontendState = state_of(request)
    request_id: str = request.state.request_id  # given by the access-log middleware
    key = await authenticate(request)
    raw = await read_limited(request, st.config.max_body_bytes)
    body = parse_body(raw)
    path = request.url.path
    model, stream = validate(INFERENCE_PATHS[path], body)
    if key.allowed_models is not None and model not in key.allowed_models:
        raise ModelNotAllowedError(
            f"this key may not use model {model!r}; allowed: {', '.join(key.allowed_models) or 'none'}",
            param="model",
        )
    headers = {"X-Request-Id": request_id}
    headers.update({name: request.headers[name] for name in ROUTING_HEADERS if name in request.headers})
    trust = trusted_providers(key, request.headers.get(TRUST_HEADER))
    if trust is not None:
        headers[TRUST_HEADER] = ",".join(trust)
    plan = plan_forward(path, body, stream, headers)
    estimate = estimate_input_tokens(body)
    early = forward_early(st.ingress, plan) if st.ledger.may_forward_early(key, estimate) else None
    try:
        admission = await st.ledger.admit(
            key,
            request_id=request_id,
            endpoint=path,
            model=model,
            stream=stream,
            input_estimate=estimate,
            sampling=sampling_params(body) if key.log_content else None,
        )
    except BaseException:
        if early is not None:
            await abandon(early)
        raise
    logger.info("request %s key %s model %s admitted as row %s", request_id, key.id, model, admission.row_id)
    response = await unless_client_leaves(request, forward(st.ingress, st.ledger, admission, plan, early))
    if response is None:
        logger.info("request %s: the client went away before the answer; the ingress was told", request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    response.headers.setdefault("X-Otela-Request-Id", request_id)
    response.headers.update(admission.limit_headers)
    if response.status_code < 400 and path != "/v1/embeddings":
        # After the last byte went out (a stream's included): hashing the prompt adds nothing to the answer's time.
        response.background = BackgroundTask(
            st.trace.after_response, admission, path, body if key.log_content else None, len(raw)
        )
    return response


@router.post(
    "/v1/chat/completions",
    summary="Chat completion (streaming with stream=true)",
    openapi_extra=_body_doc(
        ["model", "messages"],
        {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 32,
        },
    ),
)
async def chat_completions(request: Request) -> Response:
    """Forward a chat completion to a replica of its model, metered against the key."""
    return await _inference(request)


@router.post(
    "/v1/completions",
    summary="Text completion",
    openapi_extra=_body_doc(
        ["model", "prompt"], {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time"}
    ),
)
async def completions(request: Request) -> Response:
    """Forward a text completion."""
    return await _inference(request)


@router.post(
    "/v1/embeddings",
    summary="Embeddings",
    openapi_extra=_body_doc(["model", "input"], {"model": "SmolLM2-135M-Instruct", "input": "hello"}),
)
async def embeddings(request: Request) -> Response:
    """Forward an embeddings request."""
    return await _inference(request)


@router.get("/v1/models", summary="Models this key may use, with their replicas")
async def models(request: Request) -> JSONResponse:
    """The ingress's model list, narrowed to the key's allowed models and trusted providers."""
    key = await authenticate(request)
    listing = await state_of(request).ingress.get_json("/v1/models")
    data = []
    for model in listing.get("data", []):
        if key.allowed_models is not None and model.get("id") not in key.allowed_models:
            continue
        replicas = model.get("replicas", [])
        if key.trusted_providers is not None:
            replicas = [r for r in replicas if r.get("provider_id") in key.trusted_providers]
            if not replicas:
                continue
        data.append({**model, "replicas": replicas})
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/me", summary="The calling key's settings")
async def me(request: Request) -> JSONResponse:
    """The key behind the bearer token (never its secret)."""
    return JSONResponse(key_info(await authenticate(request)))


@router.get("/v1/usage", summary="The calling key's usage")
async def my_usage(request: Request, hours: int = 24, limit: int = 50) -> JSONResponse:
    """Self-service: the calling key's totals per model and day, a time series, and its latest requests."""
    key = await authenticate(request)
    ledger = state_of(request).ledger
    hours = max(1, min(hours, 24 * 90))
    since = time.time() - hours * 3600
    bucket = 300 if hours <= 6 else 3600 if hours <= 72 else 86400
    return JSONResponse(
        {
            "key": key_info(key),
            "aggregates": await ledger.aggregates(key_id=key.id),
            "series": await ledger.series(key_id=key.id, since=since, bucket_s=bucket),
            "bucket_s": bucket,
            "rows": [usage_json(r) for r in await ledger.rows(key_id=key.id, limit=max(1, min(limit, 500)))],
        }
    )


def usage_json(row: Any) -> dict[str, Any]:
    """A usage row as the API shows it."""
    return {
        "id": row.id,
        "request_id": row.request_id,
        "key_id": row.key_id,
        "endpoint": row.endpoint,
        "model": row.model,
        "stream": row.stream,
        "status": row.status,
        "http_status": row.http_status,
        "provider": row.provider,
        "node": row.node,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "tokens_estimated": row.tokens_estimated,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "latency_ms": row.latency_ms,
        "ttft_ms": row.ttft_ms,
        "sampling": row.sampling,
        "error": row.error,
    }
