"""POST /v1/chat/completions, /v1/completions, /v1/embeddings: validate, route across the mesh, stream back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from opentela.errors import (
    ConnectionClosedError,
    InvalidRequestError,
    ModelNotFoundError,
    OpenTelaError,
    StreamResetError,
    UpstreamTimeout,
    error_from_code,
)
from opentela.fabric.http_tunnel import (
    FORWARDED_REQUEST_HEADERS,
    RESET_CANCELLED,
    TunnelRequest,
    encode_request,
)
from opentela.gateway._keys import GATEWAY_KEY, REQUEST_ID_KEY, ROUTE_KEY
from opentela.gateway.errors import sse_error_event
from opentela.gateway.forwarder import Upstream
from opentela.gateway.metrics import NO_NODE
from opentela.gateway.policies import RoutedRequest
from opentela.gateway.routing import OTELA_METADATA_KEYS

if TYPE_CHECKING:
    from opentela.gateway.app import Gateway

logger = logging.getLogger(__name__)

INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens assumed for load estimates when a request sets no max_tokens."""


@dataclass(slots=True)
class ParsedBody:
    """What the gateway reads from a request body, and the body to forward."""

    model: str
    stream: bool
    metadata: dict[str, Any] | None
    """The body's routing options (trusted providers, constraints, policy), when it has any."""
    tokens: int
    raw: bytes


def parse_body(raw: bytes) -> ParsedBody:
    """Validate the JSON body; routing options in `metadata` are taken out before the body goes on."""
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("the request needs a `model` string", param="model")
    ours = None
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and any(k in metadata for k in OTELA_METADATA_KEYS):
        # Engines validate `metadata` (OpenAI allows string values only), so our keys stop here.
        ours = {k: metadata[k] for k in OTELA_METADATA_KEYS if k in metadata}
        rest = {k: v for k, v in metadata.items() if k not in OTELA_METADATA_KEYS}
        if rest:
            payload["metadata"] = rest
        else:
            del payload["metadata"]
        raw = json.dumps(payload).encode()
    out = payload.get("max_completion_tokens", payload.get("max_tokens"))
    out = out if isinstance(out, int) and not isinstance(out, bool) and out >= 0 else DEFAULT_OUTPUT_TOKENS
    return ParsedBody(model, bool(payload.get("stream")), ours, len(raw) // 4 + out, raw)


def _mid_stream_error(exc: OpenTelaError) -> OpenTelaError:
    if isinstance(exc, StreamResetError):
        return error_from_code("engine_crashed", f"the serving node failed mid-response: {exc.message}")
    if isinstance(exc, ConnectionClosedError):
        return ConnectionClosedError(f"lost the connection to the serving node mid-response: {exc.message}")
    return exc


def _is_event_stream(upstream: Upstream) -> bool:
    return upstream.head.headers.get("content-type", "").startswith("text/event-stream")


async def handle_inference(request: web.Request) -> web.StreamResponse:
    """Forward one OpenAI inference request to a replica chosen by the routing policy."""
    gw: Gateway = request.app[GATEWAY_KEY]
    request_id: str = request[REQUEST_ID_KEY]
    arrived = time.perf_counter()
    body = parse_body(await request.read())
    model = body.model
    router, forwarder, metrics = gw.router, gw.forwarder, gw.metrics
    routing = router.routing_for(request.headers, body.metadata)
    parsed_at = time.perf_counter()
    if not router.eligible(model, routing):
        err = router.explain_empty(model, routing)
        # Unknown model names come from clients: they must not become metric labels.
        metrics.errors.labels("-" if isinstance(err, ModelNotFoundError) else model, NO_NODE, err.code).inc()
        raise err
    routed_at = time.perf_counter()
    headers = {k: request.headers[k] for k in FORWARDED_REQUEST_HEADERS if k in request.headers}
    tunnel = TunnelRequest(
        request.method, request.path, body.raw, request_id, headers, gw.config.server_timing
    )
    payload = encode_request(tunnel)
    routed = RoutedRequest(request_id, model, body.stream, len(body.raw), tokens=body.tokens)
    deadline = asyncio.get_running_loop().time() + gw.config.total_timeout
    report = gw.mesh.report_failure
    tried: set[str] = set()
    node, status = NO_NODE, "error"
    upstream: Upstream | None = None

    def candidates() -> Any:
        return router.eligible(model, routing)

    try:
        async with asyncio.timeout_at(deadline):
            # Until the client sees a byte, any failure may move the request to another replica.
            while True:
                upstream = await forwarder.open(
                    candidates, payload, routed, routing.policy, tried=tried, on_failure=report
                )
                node = upstream.target.peer_id
                try:
                    if _is_event_stream(upstream):
                        first = await _first_chunk(upstream, gw.config.first_byte_timeout)
                        break
                    content = await _read_all(upstream)
                except OpenTelaError as exc:
                    err = _mid_stream_error(exc)
                    upstream.stream.reset(RESET_CANCELLED, "retrying elsewhere")  # the node stops, if alive
                    forwarder.finish(upstream, routed, ok=False, err=err, on_failure=report)
                    if err.retryable and forwarder.can_retry(candidates, tried):
                        continue
                    raise err from exc
                response = web.Response(
                    status=upstream.head.status,
                    body=content,
                    headers=_otela_headers(request_id, upstream),
                    content_type=None,
                )
                response.headers["Content-Type"] = upstream.head.headers.get(
                    "content-type", "application/json"
                )
                if gw.config.server_timing:
                    response.headers["Server-Timing"] = _server_timing(
                        arrived, parsed_at, routed_at, upstream
                    )
                ok = upstream.head.status < 500
                if ok:
                    forwarder.finish(upstream, routed, ok=True)
                else:  # the last replica's own 5xx, passed on as it is
                    failed = error_from_code(upstream.head.error_code or "engine_error", "engine failed")
                    forwarder.finish(upstream, routed, ok=False, err=failed)
                    metrics.errors.labels(model, node, failed.code).inc()
                metrics.ttfb.labels(model, node).observe(time.perf_counter() - arrived)
                metrics.bytes_in.labels(model, node).inc(len(body.raw))
                metrics.bytes_out.labels(model, node).inc(len(content))
                status = str(response.status)
                return response
        metrics.bytes_in.labels(model, node).inc(len(body.raw))
        response = await _relay_stream(
            request, gw, upstream, routed, first, deadline, arrived, parsed_at, routed_at
        )
        status = "cancelled" if routed.attrs.get("client_gone") else str(response.status)
        return response
    except TimeoutError:
        err = UpstreamTimeout(f"request {request_id} ran past the {gw.config.total_timeout:g} s deadline")
        status = str(err.status_code)
        metrics.errors.labels(model, node, err.code).inc()
        raise err from None
    except OpenTelaError as err:
        status = str(err.status_code)
        metrics.errors.labels(model, node, err.code).inc()
        raise
    except asyncio.CancelledError:
        status = "cancelled"
        raise
    finally:
        if upstream is not None and not upstream.finished:
            upstream.stream.reset(RESET_CANCELLED, "request abandoned")
            forwarder.finish(upstream, routed, ok=False)
        request[ROUTE_KEY] = {"model": model, "attempts": len(tried), "policy": routing.policy_name}
        metrics.requests.labels(model, node, status).inc()
        metrics.latency.labels(model, node).observe(time.perf_counter() - arrived)


def _server_timing(arrived: float, parsed_at: float, routed_at: float, upstream: Upstream) -> str:
    now = time.perf_counter()
    stages = [
        ("parse", parsed_at - arrived),
        ("route", routed_at - parsed_at),
        ("open", upstream.opened_at - upstream.started),
        ("upstream", upstream.head_at - upstream.opened_at),
    ]
    if upstream.head.engine_us is not None:
        stages.append(("engine", upstream.head.engine_us / 1e6))
    stages.append(("reply", now - upstream.head_at))
    return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages)


def _otela_headers(request_id: str, upstream: Upstream) -> dict[str, str]:
    target = upstream.target
    return {
        "X-Otela-Request-Id": request_id,
        "X-Otela-Node": target.peer_id,
        "X-Otela-Session": target.session_id,
        "X-Otela-Provider": target.provider_id,
    }


async def _read_all(upstream: Upstream) -> bytes:
    chunks = []
    while chunk := await upstream.stream.read():
        chunks.append(chunk)
    return b"".join(chunks)


async def _first_chunk(upstream: Upstream, timeout: float) -> bytes:
    """The first bytes of an event stream: until they exist the request can still move elsewhere."""
    try:
        async with asyncio.timeout(timeout):
            return await upstream.stream.read()
    except TimeoutError:
        raise UpstreamTimeout(f"replica {upstream.target.session_id[:8]} sent no first event") from None
    except asyncio.IncompleteReadError:
        raise error_from_code("engine_crashed", "serving node closed the stream before answering") from None


async def _relay_stream(
    request: web.Request,
    gw: Gateway,
    upstream: Upstream,
    routed: RoutedRequest,
    first: bytes,
    deadline: float,
    arrived: float,
    parsed_at: float,
    routed_at: float,
) -> web.StreamResponse:
    """Pipe SSE chunks as they arrive; after the first byte a failure can only be an SSE error event.

    Each chunk is written before the next is read, and `write` waits while the client's socket is full, so a
    slow reader holds back the mesh stream (and through its flow control the engine) instead of growing a
    buffer here.
    """
    stream, target = upstream.stream, upstream.target
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(
        status=upstream.head.status, headers=_otela_headers(routed.request_id, upstream)
    )
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    if gw.config.server_timing:
        response.headers["Server-Timing"] = _server_timing(arrived, parsed_at, routed_at, upstream)
    idle = gw.config.idle_timeout
    err: OpenTelaError | None = None
    sent = 0
    try:
        await response.prepare(request)
        gw.metrics.ttfb.labels(routed.model, target.peer_id).observe(time.perf_counter() - arrived)
        chunk = first
        try:
            while chunk:
                await response.write(chunk)
                sent += len(chunk)
                async with asyncio.timeout_at(min(deadline, loop.time() + idle)):
                    chunk = await stream.read()
        except TimeoutError:
            err = UpstreamTimeout(
                f"the stream from {target.session_id[:8]} went silent or ran past its deadline"
            )
        except (StreamResetError, ConnectionClosedError) as exc:
            err = _mid_stream_error(exc)
        if err is not None:
            logger.warning(
                "stream %s from %s broke after %d bytes: %s",
                routed.request_id,
                target.session_id[:8],
                sent,
                err,
            )
            stream.reset(RESET_CANCELLED, "stream abandoned")
            gw.forwarder.finish(upstream, routed, ok=False, err=err, on_failure=gw.mesh.report_failure)
            gw.metrics.errors.labels(routed.model, target.peer_id, err.code).inc()
            await response.write(sse_error_event(err))
        else:
            gw.forwarder.finish(upstream, routed, ok=True)
        await response.write_eof()
        gw.metrics.bytes_out.labels(routed.model, target.peer_id).inc(sent)
        return response
    except ConnectionResetError:
        # The client went away: tell the serving node, so its engine stops generating for nobody.
        stream.reset(RESET_CANCELLED, "client disconnected")
        gw.forwarder.finish(upstream, routed, ok=False)
        routed.attrs["client_gone"] = True
        return response
    except asyncio.CancelledError:
        stream.reset(RESET_CANCELLED, "client disconnected")
        raise
