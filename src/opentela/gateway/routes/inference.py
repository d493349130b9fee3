"""POST /v1/chat/completions, /v1/completions, /v1/embeddings: validate, route across the mesh, stream back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from opentela.errors import (
    ConnectionClosedError,
    InvalidRequestError,
    ModelNotFoundError,
    NoHealthyReplicaError,
    OpenTelaError,
    StreamResetError,
    UpstreamTimeout,
    error_from_code,
)
from opentela.fabric.http_tunnel import FORWARDED_REQUEST_HEADERS, RESET_CANCELLED, TunnelRequest
from opentela.gateway.errors import sse_error_event
from opentela.gateway.forwarder import Upstream
from opentela.gateway.policies import RoutedRequest

if TYPE_CHECKING:
    from opentela.gateway.app import Gateway

logger = logging.getLogger(__name__)

INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def _parse_body(raw: bytes) -> tuple[str, bool]:
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("the request needs a `model` string", param="model")
    return model, bool(payload.get("stream"))


def _no_replica_error(gw: Gateway, model: str) -> OpenTelaError:
    if model in gw.mesh.known_model_ids():
        return NoHealthyReplicaError(f"model {model!r} is known but no healthy replica serves it right now")
    available = sorted(gw.mesh.model_replicas())
    listing = ", ".join(available) if available else "none are being served"
    return ModelNotFoundError(
        f"model {model!r} is not served in this mesh; available models: {listing}", param="model"
    )


def _mid_stream_error(exc: OpenTelaError) -> OpenTelaError:
    if isinstance(exc, StreamResetError):
        return error_from_code("engine_crashed", f"the serving node failed mid-response: {exc.message}")
    if isinstance(exc, ConnectionClosedError):
        return ConnectionClosedError(f"lost the connection to the serving node mid-response: {exc.message}")
    return exc


async def handle_inference(request: web.Request) -> web.StreamResponse:
    """Forward one OpenAI inference request to a replica chosen by the routing policy."""
    gw: Gateway = request.app["gateway"]
    request_id: str = request["request_id"]
    arrived = time.perf_counter()
    raw = await request.read()
    model, streaming = _parse_body(raw)
    if not gw.mesh.candidates(model):
        raise _no_replica_error(gw, model)
    headers = {k: request.headers[k] for k in FORWARDED_REQUEST_HEADERS if k in request.headers}
    tunnel = TunnelRequest(request.method, request.path, raw, request_id, headers)
    routed = RoutedRequest(request_id, model, streaming, len(raw))
    metrics = gw.metrics
    metrics.in_flight.labels(model).inc()
    status, node = "error", "-"
    tried: set[str] = set()
    try:
        async with asyncio.timeout(gw.config.total_timeout):
            while True:
                upstream = await gw.forwarder.open(
                    lambda: gw.mesh.candidates(model),
                    tunnel,
                    routed,
                    tried=tried,
                    on_failure=gw.mesh.report_failure,
                )
                node = upstream.target.peer_id
                metrics.ttfb.labels(model).observe(time.perf_counter() - arrived)
                if upstream.head.headers.get("content-type", "").startswith("text/event-stream"):
                    response = await _relay_stream(request, gw, upstream, routed)
                    break
                try:
                    body = await _read_all(upstream)
                except OpenTelaError as exc:
                    err = _mid_stream_error(exc)
                    gw.forwarder.fail(upstream.target, routed, err, upstream.started, gw.mesh.report_failure)
                    # Nothing reached the client yet, so a complete (non-streaming) answer can still come from
                    # another replica.
                    if err.retryable and len(tried) <= gw.config.max_retries:
                        continue
                    raise err from exc
                gw.forwarder.policy.on_request_end(
                    upstream.target,
                    routed,
                    ok=upstream.head.status < 500,
                    latency_s=time.perf_counter() - arrived,
                )
                metrics.bytes_out.labels(model).inc(len(body))
                response = web.Response(
                    status=upstream.head.status,
                    body=body,
                    headers=_otela_headers(request_id, upstream),
                    content_type=None,
                )
                response.headers["Content-Type"] = upstream.head.headers.get(
                    "content-type", "application/json"
                )
                break
        if len(tried) > 1:
            metrics.retries.labels(model).inc(len(tried) - 1)
        status = str(response.status)
        return response
    except TimeoutError:
        err = UpstreamTimeout(f"request {request_id} ran past the {gw.config.total_timeout:.0f} s deadline")
        status = str(err.status_code)
        metrics.errors.labels(model, err.code).inc()
        raise err from None
    except OpenTelaError as err:
        status = str(err.status_code)
        metrics.errors.labels(model, err.code).inc()
        raise
    finally:
        metrics.in_flight.labels(model).dec()
        metrics.requests.labels(model, node, status).inc()
        metrics.latency.labels(model).observe(time.perf_counter() - arrived)


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
    try:
        while chunk := await upstream.stream.read():
            chunks.append(chunk)
    except BaseException:
        upstream.stream.reset(RESET_CANCELLED, "response abandoned")
        raise
    return b"".join(chunks)


async def _relay_stream(
    request: web.Request, gw: Gateway, upstream: Upstream, routed: RoutedRequest
) -> web.StreamResponse:
    """Pipe SSE chunks as they arrive; after the first byte a failure can only be an SSE error event."""
    stream, target = upstream.stream, upstream.target
    response = web.StreamResponse(
        status=upstream.head.status, headers=_otela_headers(routed.request_id, upstream)
    )
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    ok = False
    sent = 0
    try:
        await response.prepare(request)
        try:
            while chunk := await stream.read():
                await response.write(chunk)
                sent += len(chunk)
            ok = True
        except (StreamResetError, ConnectionClosedError) as exc:
            err = _mid_stream_error(exc)
            logger.warning(
                "stream %s from %s broke after %d bytes: %s",
                routed.request_id,
                target.session_id[:8],
                sent,
                exc,
            )
            gw.mesh.report_failure(target, err)
            gw.metrics.errors.labels(routed.model, err.code).inc()
            await response.write(sse_error_event(err))
        await response.write_eof()
        gw.metrics.bytes_out.labels(routed.model).inc(sent)
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: tell the serving node, so its engine stops generating for nobody.
        stream.reset(RESET_CANCELLED, "client disconnected")
        raise
    finally:
        gw.forwarder.policy.on_request_end(
            target, routed, ok=ok, latency_s=time.perf_counter() - upstream.started
        )
