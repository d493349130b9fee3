"""Forward one admitted request to the ingress and finish its usage row in the code path that ends the response.

The guarantee: a usage row exists (status `pending`) before the first byte of an answer reaches the client, and it
is completed before the last byte is handed over (the body of a non-streaming answer, the `[DONE]` event of a
stream). A client that received a whole response therefore always has a completed row behind it; a frontend killed
earlier leaves a pending row that the next start marks `interrupted`. With in-memory admission the pending row's
commit runs while the request is forwarded, and the answer waits for it (it is long done by the time an engine
answers). With admission through the database the row is committed by admission, which the request waits for; a
key far from its limits is forwarded while that happens (`forward_early`), and a request refused after all is
cancelled before anything of its answer is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import Response, StreamingResponse

from opentela.errors import OpenTelaError
from opentela.frontend.ingress import Ingress, UpstreamResponse
from opentela.frontend.token_counts import (
    ReasoningSeen,
    SseEvents,
    TokenCount,
    chunk_text,
    event_data,
    usage_from,
)
from opentela.frontend.usage import Admission, Outcome, UsageLedger
from opentela.openai_edge import estimate_text_tokens, sse_error_event

logger = logging.getLogger(__name__)

PASSED_HEADERS = (
    "x-otela-request-id",
    "x-otela-node",
    "x-otela-session",
    "x-otela-provider",
    "x-otela-model",
    # The ingress's error answers: when to retry (the openai SDK honours it) and when a limit frees up.
    "retry-after",
    "x-otela-limit-resets-at",
)
CHECKPOINT_EVERY_S = 2.0
RESPONSES_PATH = "/v1/responses"
NO_STREAM_OPTIONS = ("/v1/embeddings", RESPONSES_PATH)
"""Paths whose bodies take no `stream_options` (Responses streams report usage in their terminal event)."""
RESPONSES_TERMINAL = {"response.completed": "ok", "response.incomplete": "ok", "response.failed": "error"}
"""The events that end a Responses stream, and the row status each gives; the row is completed before them."""


@dataclass
class ForwardPlan:
    """What to send: the path, the body as forwarded, headers, and what the client asked for."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool
    client_wants_usage: bool

    def encoded(self) -> bytes:
        """The body as sent."""
        return json.dumps(self.body).encode()


def plan_forward(path: str, body: dict[str, Any], stream: bool, headers: dict[str, str]) -> ForwardPlan:
    """Ask a stream for its usage in the final chunk (stream_options.include_usage), remembering if the client did."""
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else None
    wants = bool(options and options.get("include_usage"))
    if stream and path not in NO_STREAM_OPTIONS:
        body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
    return ForwardPlan(path, body, headers, stream, wants)


def _meta(resp: UpstreamResponse) -> tuple[dict[str, str], str | None, str | None]:
    headers = {k: v for k, v in resp.headers.items() if k.lower() in PASSED_HEADERS}
    return headers, resp.headers.get("X-Otela-Provider"), resp.headers.get("X-Otela-Node")


async def _finish(ledger: UsageLedger, admission: Admission, outcome: Outcome) -> None:
    # Shielded: a client that goes away cancels the handler, and the row must still be written.
    with anyio.CancelScope(shield=True):
        try:
            await ledger.complete(admission, outcome)
        except Exception:
            logger.exception(
                "could not complete usage row %s (request %s)", admission.row_id, admission.request_id
            )
            raise


def forward_early(ingress: Ingress, plan: ForwardPlan) -> asyncio.Task[UpstreamResponse]:
    """Start sending the request while its admission is still being decided (UsageLedger.may_forward_early): the
    database round trip of admission then overlaps the mesh and the engine instead of adding to them. Nothing of the
    answer reaches the client before the admission is decided and its row written."""
    return asyncio.ensure_future(ingress.post(plan.path, plan.encoded(), plan.headers))


async def abandon(early: asyncio.Task[UpstreamResponse]) -> None:
    """Stop an early forward whose request was refused: cancel it (the mesh tells the engine to stop), or release
    the answer that already came."""
    if not early.done():
        early.cancel()
    with contextlib.suppress(BaseException):
        (await early).release()


async def forward(
    ingress: Ingress,
    ledger: UsageLedger,
    admission: Admission,
    plan: ForwardPlan,
    early: asyncio.Task[UpstreamResponse] | None = None,
) -> Response:
    """Send the request on (or take over its early forward) and meter it; errors before the response starts become
    OpenAI error JSON."""
    try:
        resp = await (early if early is not None else ingress.post(plan.path, plan.encoded(), plan.headers))
    except OpenTelaError as err:
        await _finish(
            ledger,
            admission,
            Outcome(
                "error",
                err.status_code,
                input_tokens=admission.input_estimate,
                tokens_estimated=True,
                error=err.message,
            ),
        )
        raise
    except BaseException:
        await _finish(
            ledger,
            admission,
            Outcome(
                "cancelled",
                input_tokens=admission.input_estimate,
                tokens_estimated=True,
                error="client went away",
            ),
        )
        raise
    is_sse = resp.headers.get("Content-Type", "").startswith("text/event-stream")
    if plan.stream and is_sse and resp.status == 200:
        try:
            await ledger.recorded(admission)  # no byte reaches the client before its row is durable
        except BaseException:
            resp.release()
            raise
        return StreamingResponse(
            _relay(resp, ledger, admission, plan),
            status_code=200,
            media_type="text/event-stream",
            headers={**_meta(resp)[0], "Cache-Control": "no-cache", "X-Otela-Usage-Row": admission.row_id},
        )
    return await _whole(resp, ledger, admission)


async def _whole(resp: UpstreamResponse, ledger: UsageLedger, admission: Admission) -> Response:
    headers, provider, node = _meta(resp)
    try:
        try:
            data = await resp.read()
        except OpenTelaError as err:
            await _finish(
                ledger,
                admission,
                Outcome(
                    "error",
                    err.status_code,
                    provider,
                    node,
                    admission.input_estimate,
                    0,
                    True,
                    error=err.message,
                ),
            )
            raise
    except asyncio.CancelledError:
        await _finish(
            ledger,
            admission,
            Outcome(
                "cancelled", None, provider, node, admission.input_estimate, 0, True, error="client went away"
            ),
        )
        raise
    finally:
        resp.release()
    try:
        payload = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        payload = None
    count = _count_whole(payload, admission)
    ok = resp.status < 400
    if ok:
        seen = ReasoningSeen()
        seen.feed(payload)
        admission.reasoning = seen.value
    error = None
    if not ok and isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = str(payload["error"].get("message", ""))[:1000]
    await _finish(
        ledger,
        admission,
        Outcome(
            "ok" if ok else "error",
            resp.status,
            provider,
            node,
            count.input,
            count.output,
            count.estimated,
            error=error,
        ),
    )
    return Response(
        data,
        status_code=resp.status,
        media_type=resp.headers.get("Content-Type", "application/json"),
        headers={**headers, "X-Otela-Usage-Row": admission.row_id},
    )


def reported_usage(payload: Any) -> tuple[int, int] | None:
    """(input, output) tokens a chat or completion answer, a Response, or a Responses stream's terminal event
    reports, if it reports them."""
    found = usage_from(payload)
    if found is not None or not isinstance(payload, dict):
        return found
    response = payload.get("response")
    usage = (response if isinstance(response, dict) else payload).get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    output = usage.get("output_tokens")
    return usage["input_tokens"], output if isinstance(output, int) else 0


def _response_text(payload: dict[str, Any]) -> str:
    """The output text of a Response object."""
    parts = []
    for item in payload.get("output") or ():
        for part in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    return "".join(parts)


def _choice_text(choice: Any) -> str:
    """The generated text of one choice of a whole chat or completion answer."""
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return message["content"]
    return choice["text"] if isinstance(choice.get("text"), str) else ""


def _count_whole(payload: Any, admission: Admission) -> TokenCount:
    reported = reported_usage(payload)
    choices = payload.get("choices") if isinstance(payload, dict) else None
    choices = choices if isinstance(choices, list) else []
    if reported is not None:
        if len(choices) > 1:
            # llama.cpp reports one sequence's completion tokens for an answer of several (`n` > 1, a list of
            # prompts): metering that would let a key's budget be bypassed, so the choices' own text is a floor.
            floor = sum(estimate_text_tokens(_choice_text(c)) for c in choices)
            if floor > reported[1]:
                return TokenCount(reported[0], floor, estimated=True)
        return TokenCount(reported[0], reported[1], estimated=False)
    if isinstance(payload, dict) and payload.get("object") == "response":
        text = _response_text(payload)
    else:
        text = "".join(_choice_text(c) for c in choices)
    return TokenCount(admission.input_estimate, estimate_text_tokens(text), estimated=True)


def _response_error(event: dict[str, Any]) -> str | None:
    response = event.get("response")
    err = response.get("error") if isinstance(response, dict) else None
    if not isinstance(err, dict):
        return None
    return str(err.get("message", ""))[:1000] or None


async def _relay(
    resp: UpstreamResponse, ledger: UsageLedger, admission: Admission, plan: ForwardPlan
) -> AsyncIterator[bytes]:
    """Pass SSE events through one by one; complete the usage row before the [DONE] event (a Responses stream's
    terminal event) is sent."""
    _, provider, node = _meta(resp)
    events = SseEvents()
    reasoning = ReasoningSeen()
    reported: tuple[int, int] | None = None
    content_chunks = 0
    ttft_ms: float | None = None
    error: str | None = None
    finished = False
    last_checkpoint = time.monotonic()

    several = False
    """Text came for more than one choice (`n` > 1, a list of prompts)."""

    def outcome(status: str, why: str | None = None) -> Outcome:
        if reported is not None:
            if several and content_chunks > reported[1]:
                # llama.cpp's usage counts one choice of several: their streamed chunks are the floor.
                return Outcome(
                    status, 200, provider, node, reported[0], content_chunks, True, ttft_ms, why or error
                )
            return Outcome(
                status, 200, provider, node, reported[0], reported[1], False, ttft_ms, why or error
            )
        # No usage from the engine: one streamed content chunk is one token for the engines we know of.
        return Outcome(
            status, 200, provider, node, admission.input_estimate, content_chunks, True, ttft_ms, why or error
        )

    try:
        async for chunk in resp.chunks():
            for event in events.feed(chunk):
                data = event_data(event)
                if data == "[DONE]":
                    admission.reasoning = reasoning.value
                    await _finish(ledger, admission, outcome("error" if error else "ok"))
                    finished = True
                    yield event
                    continue
                if isinstance(data, dict) and data.get("type") in RESPONSES_TERMINAL:
                    # A Responses stream ends with this event, not [DONE]: the row is done before it goes out.
                    reported = reported_usage(data) or reported
                    failed = RESPONSES_TERMINAL[data["type"]] == "error"
                    if failed:
                        error = _response_error(data) or "the response failed"
                    await _finish(ledger, admission, outcome("error" if error else "ok"))
                    finished = True
                    yield event
                    continue
                if isinstance(data, dict):
                    reasoning.feed(data)
                    if isinstance(data.get("error"), dict):
                        error = str(data["error"].get("message", "stream error"))[:1000]
                    elif data.get("type") == "error":
                        error = str(data.get("message", "stream error"))[:1000]
                    if data.get("type") == "response.output_text.delta":  # a Responses stream's text
                        content_chunks += 1
                        if ttft_ms is None:
                            ttft_ms = round((time.time() - admission.started_at) * 1000, 3)
                    usage = usage_from(data)
                    if usage is not None:
                        reported = usage
                        if not data.get("choices") and not plan.client_wants_usage:
                            continue  # the usage-only chunk we asked for; the client did not
                    if chunk_text(data):
                        content_chunks += 1
                        several = several or any(
                            isinstance(c, dict) and c.get("index", 0) != 0 for c in data.get("choices") or ()
                        )
                        if ttft_ms is None:
                            ttft_ms = round((time.time() - admission.started_at) * 1000, 3)
                yield event
            if time.monotonic() - last_checkpoint > CHECKPOINT_EVERY_S and not finished:
                last_checkpoint = time.monotonic()
                with anyio.CancelScope(shield=True):
                    await ledger.checkpoint(admission, content_chunks, provider, node)
        rest = events.rest()
        if not finished:
            await _finish(ledger, admission, outcome("error", error or "the stream ended without [DONE]"))
            finished = True
        if rest:
            yield rest
    except OpenTelaError as err:
        if not finished:
            await _finish(ledger, admission, outcome("error", err.message))
            finished = True
        yield sse_error_event(err)
    finally:
        if not finished:
            await _finish(ledger, admission, outcome("cancelled", "client went away mid-stream"))
        resp.release()
