"""The OpenAI-compatible surface: authenticate the key, validate, admit against its limits, forward and meter."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
import zlib
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from opentela.errors import InvalidRequestError, OpenTelaError, RequestTooLargeError
from opentela.frontend.errors import ACCEPTED_ENCODINGS, ModelNotAllowedError, UnsupportedContentEncodingError
from opentela.frontend.ingress import Ingress
from opentela.frontend.keys import key_info
from opentela.frontend.metering import RESPONSES_PATH, abandon, forward, forward_early, plan_forward
from opentela.frontend.schema import ApiKey
from opentela.frontend.state import FrontendState, bearer_token, state_of
from opentela.frontend.token_counts import sampling_params
from opentela.gateway import responses
from opentela.gateway.model_names import ModelNames, Retired, unknown_model_error
from opentela.openai_edge import (
    INFERENCE_PATHS,
    estimate_input_tokens,
    model_and_stream,
    parse_body,
    validate,
)

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


def content_codings(header: str | None) -> list[str]:
    """The codings of a Content-Encoding header, in the order they were applied; 415 for one we cannot undo."""
    codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
    unknown = [c for c in codings if c not in ("gzip", "x-gzip", "deflate", "identity")]
    if unknown:
        raise UnsupportedContentEncodingError(
            f"Content-Encoding {unknown[0]!r} is not supported; send the body as one of {ACCEPTED_ENCODINGS}",
            param="Content-Encoding",
        )
    return [c for c in codings if c != "identity"]


def _inflate(data: bytes, coding: str, limit: int) -> bytes:
    # gzip (any member count) by its header; deflate as zlib data, or raw deflate as some clients send it.
    wbits = 16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
    if coding == "deflate" and data[:1] and (data[0] & 0x0F != 8 or int.from_bytes(data[:2], "big") % 31):
        wbits = -zlib.MAX_WBITS
    out, rest = [], data
    size = 0
    while rest:
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise InvalidRequestError(f"the request body is not valid {coding} data: {exc}") from None
        size += len(chunk)
        out.append(chunk)
        if size > limit or inflater.unconsumed_tail:
            # Checked on the output, not the declared size: a few kilobytes may inflate to gigabytes.
            raise RequestTooLargeError(f"the decompressed request body is over the limit of {limit} bytes")
        if not inflater.eof:
            raise InvalidRequestError(f"the request body's {coding} data is cut short")
        rest = inflater.unused_data if wbits > 0 else b""
    return b"".join(out)


def decoded_body(raw: bytes, codings: list[str], limit: int) -> bytes:
    """`raw` with its content codings undone (the last applied first), refusing more than `limit` bytes (413)."""
    for coding in reversed(codings):
        raw = _inflate(raw, coding, limit)
    return raw


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinity (in nested dicts and lists too) turned into null, so that a stored row
    always renders as JSON."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    return value


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, gzip or deflate undone, refusing more than `limit` bytes (413) before or after decompression
    without reading further, and a content coding it cannot undo (415) before reading."""
    codings = content_codings(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return decoded_body(b"".join(chunks), codings, limit)


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


NAMES_TTL_S = 10.0
"""How long the ingress's alias table is reused before it is read again (it changes only when the ingress
restarts with another configuration)."""


class IngressNames:
    """The ingress's model names (aliases, retired names, default model) as last read from `/v1/dnt/names`.

    The frontend resolves an alias before admission, so the usage row, the key's allowed models and the request
    forwarded all name the model that serves it. When the ingress cannot say (an older ingress, or none
    answering), no name is resolved here and the ingress still resolves aliases itself.
    """

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self.names = ModelNames()
        self.read_at = float("-inf")
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<IngressNames {self.names!r}>"

    async def current(self) -> ModelNames:
        """The table, read again when older than NAMES_TTL_S."""
        if time.monotonic() - self.read_at < NAMES_TTL_S:
            return self.names
        async with self._lock:
            if time.monotonic() - self.read_at >= NAMES_TTL_S:
                self.names = await self._read()
                self.read_at = time.monotonic()
        return self.names

    async def _read(self) -> ModelNames:
        try:
            table = await self.ingress.get_json("/v1/dnt/names")
            retired = {
                r["id"]: Retired(r["id"], r.get("replacement") or "", r.get("message") or "")
                for r in table.get("retired") or ()
                if isinstance(r, dict) and isinstance(r.get("id"), str)
            }
            return ModelNames(table.get("aliases") or {}, retired, table.get("default_model") or "")
        except (OpenTelaError, AttributeError, TypeError) as exc:
            logger.debug("the ingress did not give its model names: %s", exc)
            return ModelNames()


_NAMES: weakref.WeakKeyDictionary[Ingress, IngressNames] = weakref.WeakKeyDictionary()


def ingress_names(st: FrontendState) -> IngressNames:
    """The cached model names of the state's ingress."""
    found = _NAMES.get(st.ingress)
    if found is None:
        found = _NAMES[st.ingress] = IngressNames(st.ingress)
    return found


def _allowed(key: ApiKey, *names: str) -> bool:
    return key.allowed_models is None or any(n in key.allowed_models for n in names)


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
    names = await ingress_names(st).current()
    asked = body.get("model")
    if names and (asked is None or isinstance(asked, str)):
        # An alias (or no model: the default) is forwarded, admitted and metered as the model that serves it; a
        # retired name is refused here, before anything is metered.
        served = names.resolve(asked)
        if served is not None:
            body["model"] = served
    chat: dict[str, Any] | None = None
    if path == RESPONSES_PATH:
        model, stream = model_and_stream(body)
        responses.check_stateless(body)
        try:  # the chat request it would become: for the estimate and the trace
            chat = responses.chat_body(responses.parse_request(body), model)
        except InvalidRequestError:
            pass  # only an engine that serves /v1/responses itself takes it: the ingress decides
    else:
        model, stream = validate(INFERENCE_PATHS[path], body)
    if not _allowed(key, model, asked if isinstance(asked, str) else model):
        raise ModelNotAllowedError(
            f"this key may not use model {model!r}; allowed: {', '.join(key.allowed_models or ()) or 'none'}",
            param="model",
        )
    headers = {"X-Request-Id": request_id}
    headers.update({name: request.headers[name] for name in ROUTING_HEADERS if name in request.headers})
    trust = trusted_providers(key, request.headers.get(TRUST_HEADER))
    if trust is not None:
        headers[TRUST_HEADER] = ",".join(trust)
    plan = plan_forward(path, body, stream, headers)
    estimate = estimate_input_tokens(
        chat or ({"prompt": body.get("input")} if path == RESPONSES_PATH else body)
    )
    early = forward_early(st.ingress, plan) if st.ledger.may_forward_early(key, estimate) else None
    try:
        admission = await st.ledger.admit(
            key,
            request_id=request_id,
            endpoint=path,
            model=model,
            stream=stream,
            input_estimate=estimate,
            sampling=sampling_params(chat or body) if key.log_content else None,
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
        # A Responses request is traced as the chat request it stands for (its prompt hashes the same way).
        traced, traced_path = (chat, responses.CHAT_PATH) if chat is not None else (body, path)
        response.background = BackgroundTask(
            st.trace.after_response, admission, traced_path, traced if key.log_content else None, len(raw)
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


@router.post(
    "/v1/responses",
    summary="Response (OpenAI's Responses API; streaming with stream=true; nothing is stored)",
    openapi_extra=_body_doc(
        ["model", "input"],
        {"model": "SmolLM2-135M-Instruct", "input": "Hello!", "max_output_tokens": 32},
    ),
)
async def create_response(request: Request) -> Response:
    """Forward a Responses request (translated to chat completions at the ingress where engines need it)."""
    return await _inference(request)


async def _visible_models(request: Request, key: ApiKey) -> list[dict[str, Any]]:
    """The ingress's model list narrowed to the key's allowed models and trusted providers; an alias is shown
    when its name or its target is allowed."""
    listing = await state_of(request).ingress.get_json("/v1/models")
    data = []
    for model in listing.get("data", []):
        if not _allowed(key, model.get("id"), model.get("alias_for") or model.get("id")):
            continue
        replicas = model.get("replicas", [])
        if key.trusted_providers is not None:
            replicas = [r for r in replicas if r.get("provider_id") in key.trusted_providers]
            if not replicas:
                continue
        data.append({**model, "replicas": replicas})
    return data


@router.get("/v1/models", summary="Models this key may use, with their replicas")
async def models(request: Request) -> JSONResponse:
    """The ingress's model list, narrowed to the key's allowed models and trusted providers."""
    key = await authenticate(request)
    return JSONResponse({"object": "list", "data": await _visible_models(request, key)})


@router.get("/v1/models/{model_id:path}", summary="One model this key may use (ids may contain slashes)")
async def retrieve_model(request: Request, model_id: str) -> JSONResponse:
    """One model object of the list; 404 in OpenAI's error shape, naming close names or a retired name's
    replacement, when the key cannot see a model by that name."""
    key = await authenticate(request)
    data = await _visible_models(request, key)
    found = next((m for m in data if m.get("id") == model_id), None)
    if found is not None:
        return JSONResponse(found)
    retired = (await ingress_names(state_of(request)).current()).retired.get(model_id)
    if retired is not None:
        raise retired.error()
    served = [m["id"] for m in data if isinstance(m.get("id"), str) and "alias_for" not in m]
    raise unknown_model_error(model_id, [m["id"] for m in data if isinstance(m.get("id"), str)], served)


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
    """A usage row as the API shows it (a NaN or infinity an older version stored shows as null)."""
    return finite_json(
        {
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
    )
