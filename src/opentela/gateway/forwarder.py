"""Dispatch: choose a replica, open a tunnel stream to it, retry elsewhere while the client has seen nothing,
relay the answer, and book every attempt and every request exactly once."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from opentela import openai_edge as edge
from opentela._types import Stream
from opentela.errors import (
    ConnectionClosedError,
    EngineError,
    ModelNotFoundError,
    NoHealthyReplicaError,
    OpenTelaError,
    StreamResetError,
    UpstreamTimeout,
    error_from_code,
)
from opentela.fabric.http_tunnel import (
    FORWARDED_REQUEST_HEADERS,
    MODEL_HEADER,
    RESET_CANCELLED,
    TunnelRequest,
    TunnelResponseHead,
    encode_request,
    read_response_head,
)
from opentela.gateway import responses, resume
from opentela.gateway._config import GatewayConfig
from opentela.gateway.call import Attempt, Call, body_of
from opentela.gateway.constraints import require_tool_takers, tool_takers, wants_tools
from opentela.gateway.metrics import NO_NODE, GatewayMetrics
from opentela.gateway.output_cap import OutputCap
from opentela.gateway.policies import RoutedRequest, RoutingPolicy
from opentela.gateway.responses_stream import ResponsesEventStream
from opentela.gateway.routing import OTELA_METADATA_KEYS, Router, prefer_serving
from opentela.gateway.timeout_classes import TimeoutClass, TimeoutClasses
from opentela.registry.record import NodeRecord

logger = logging.getLogger(__name__)

OpenStream = Callable[[NodeRecord, float], Awaitable[Stream]]
"""Opens a /otela/http/1 stream to the node of a record within a timeout (seconds)."""
OnFailure = Callable[[NodeRecord, OpenTelaError], None]
Write = Callable[[bytes], Awaitable[None]]
"""Sends bytes to the client; waits while its socket is full, raises ConnectionResetError once it left."""

RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})
"""Engine answers worth another replica: it failed, not the request (501/505 would fail anywhere)."""


def _mid_stream_error(exc: OpenTelaError) -> OpenTelaError:
    if isinstance(exc, StreamResetError):
        return error_from_code("engine_crashed", f"the serving node failed mid-response: {exc.message}")
    if isinstance(exc, ConnectionClosedError):
        return ConnectionClosedError(f"lost the connection to the serving node mid-response: {exc.message}")
    return exc


class Forwarder:
    """Owns a request's whole life at the ingress: `accept` it, `dispatch` it to one replica at a time (moving
    on while the failure allows it), `relay` a stream, and `close` it.

    Every attempt is booked exactly once, in `_end`: `Router.started` when it begins, `Router.ended`, the
    in-flight gauge, the health tracker and the mesh's failure report when it ends. Every request is booked
    once, in `close`.
    """

    def __init__(
        self,
        config: GatewayConfig,
        router: Router,
        open_stream: OpenStream,
        metrics: GatewayMetrics,
        report: OnFailure | None = None,
    ) -> None:
        self.config = config
        self.router = router
        self.output_cap = OutputCap(config.max_output_tokens, config.output_caps())
        self.timeouts = TimeoutClasses.from_config(config)
        self._open_stream = open_stream
        self._report = report
        self.metrics = metrics
        self.retries = 0

    def __repr__(self) -> str:
        return f"<Forwarder policy={self.config.policy} retries={self.retries}>"

    @property
    def policy(self) -> RoutingPolicy:
        """The ingress's default policy."""
        return self.router.default_policy

    # --- one request ----------------------------------------------------------------------------------------
    def accept(
        self, request_id: str, path: str, raw: bytes, headers: Mapping[str, str], arrived: float
    ) -> Call:
        """Parse the body and check that some replica may serve it; raises the client's error if none may.

        The model it names is resolved first (an alias becomes the id it stands for, a missing one the default
        model, a retired one is refused), and a Responses request for engines that lack /v1/responses becomes
        a chat request whose answer is translated back (gateway/responses.py)."""
        asked = edge.parse_body(raw)
        changed = self._resolve_model(asked)
        kind = edge.INFERENCE_PATHS.get(path)
        answer = None
        if path == responses.RESPONSES_PATH:
            path, asked, answer = self._responses(asked, headers)
            changed = changed or answer is not None
        body = body_of(asked, json.dumps(asked).encode() if changed else raw, prefix=self.router.uses_prefix)
        routing = self.router.routing_for(headers, body.metadata)
        parsed_at = time.perf_counter()
        pool = self.router.eligible(body.model, routing)
        if not pool:
            err = self.router.explain_empty(body.model, routing)
            # Unknown model names come from clients: they must not become metric labels.
            label = "-" if isinstance(err, ModelNotFoundError) else body.model
            self.metrics.errors.labels(label, NO_NODE, err.code).inc()
            raise err
        if kind is not None:  # after the model's check: an unknown model is the first thing to hear about
            edge.check_fields(kind, asked, body.stream)
        needs_tools = kind == "chat" and wants_tools(asked)
        if needs_tools:
            pool = require_tool_takers(pool, body.model)
        if body.asked_output is not None:
            asked_output = body.asked_output
            if answer is not None:  # a Responses request: the client named the field max_output_tokens
                asked_output = ("max_output_tokens", asked_output[1])
            try:
                self.output_cap.check(body.model, asked_output, pool)
            except OpenTelaError as err:
                self.metrics.errors.labels(body.model, NO_NODE, err.code).inc()
                raise
        routed_at = time.perf_counter()
        forwarded = {k: headers[k] for k in FORWARDED_REQUEST_HEADERS if k in headers}
        forwarded[MODEL_HEADER] = body.model
        payload = encode_request(
            TunnelRequest("POST", path, body.raw, request_id, forwarded, self.config.server_timing)
        )
        routed = RoutedRequest(
            request_id,
            body.model,
            body.stream,
            len(body.raw),
            tokens=body.tokens,
            input_tokens=body.input_tokens,
            prefix=body.prefix,
        )
        limits = self.timeouts.for_model(body.model, pool)
        call = Call(self, request_id, body, routing, routed, payload, arrived, parsed_at, routed_at, limits)
        call.pool = pool
        call.kind = kind
        call.needs_tools = needs_tools
        if resume.wanted(path, body.stream, headers):
            call.splice = resume.StreamSplice(path, forwarded)
        if answer is not None:
            call.answer = answer
            call.events = ResponsesEventStream(answer) if body.stream else None
        return call

    def _resolve_model(self, payload: dict[str, Any]) -> bool:
        """Put the served id of the body's model (alias, default) in its place; whether the body changed."""
        names = self.router.names
        if not names:
            return False
        asked = payload.get("model")
        model = names.resolve(asked)
        if model is None or model == asked:
            return False
        payload["model"] = model
        return True

    def model_of(self, raw: bytes) -> str:
        """The served id the body's model stands for (for the routes' split-model and cold-start paths)."""
        payload = edge.parse_body(raw)
        self._resolve_model(payload)
        return edge.model_and_stream(payload)[0]

    def _responses(
        self, payload: dict[str, Any], headers: Mapping[str, str]
    ) -> tuple[str, dict[str, Any], responses.ResponsesAnswer | None]:
        """(path, body, translator) of a Responses request: as it came when every replica it may go to serves
        /v1/responses itself, else the chat request that serves it and the translator of its answer."""
        model, _ = edge.model_and_stream(payload)
        responses.check_stateless(payload)
        metadata = payload.get("metadata")
        ours = (
            {k: metadata[k] for k in OTELA_METADATA_KEYS if k in metadata}
            if isinstance(metadata, dict)
            else {}
        )
        pool = self.router.eligible(model, self.router.routing_for(headers, ours or None))
        if pool and all(responses.serves_responses(r, model) for r in pool):
            return responses.RESPONSES_PATH, payload, None
        req = responses.parse_request(payload, OTELA_METADATA_KEYS)
        return responses.CHAT_PATH, responses.chat_body(req, model), responses.ResponsesAnswer(req, model)

    async def dispatch(self, call: Call) -> bytes:
        """The whole answer, or for an event stream its first chunk; retried elsewhere until the client has a
        byte. Afterwards `call.attempt` is the attempt that answered."""
        limits = call.limits
        call.deadline = asyncio.get_running_loop().time() + limits.total_timeout

        def candidates() -> Sequence[NodeRecord]:
            pool, call.pool = call.pool, None
            # `accept`'s pool is still current for the first attempt: nothing has waited since it was read.
            return pool if pool is not None else self._eligible(call)

        try:
            async with asyncio.timeout_at(call.deadline):
                while True:
                    attempt = call.attempt = await self.open(
                        candidates,
                        call.payload,
                        call.routed,
                        call.routing.policy,
                        tried=call.tried,
                        limits=limits,
                    )
                    try:
                        if attempt.event_stream:
                            return await self._first_chunk(attempt, limits)
                        content = await self._read_all(attempt)
                        break
                    except OpenTelaError as exc:
                        err = _mid_stream_error(exc)
                        self._end(attempt, call.routed, ok=False, err=err, reset="retrying elsewhere")
                        if err.retryable and self.can_retry(candidates, call.tried, limits):
                            continue
                        raise err from exc
        except TimeoutError:
            raise UpstreamTimeout(
                f"request {call.request_id} ran past the {limits.total_timeout:g} s deadline "
                f"(timeout class {limits.name})"
            ) from None
        assert attempt.head is not None
        if attempt.head.status >= 400:
            content = edge.engine_error_body(attempt.head.status, content, call.kind)
        if call.answer is not None:
            content = call.answer.whole(attempt.head.status, content)
        if attempt.head.status >= 500:  # the last replica's own 5xx, passed on as it is
            call.error = error_from_code(attempt.head.error_code or "engine_error", "engine failed")
        # The attempt's end and the time to first byte are booked when the call closes, once the client has
        # its answer: the policies, health and metrics can wait for that, the client should not.
        call.answered_at = time.perf_counter()
        call.status = str(attempt.head.status)
        call.sent = len(content)
        return content

    def _eligible(self, call: Call) -> Sequence[NodeRecord]:
        """The replicas `call` may go to now: only those that take tools when it asks for tool calls."""
        pool = self.router.eligible(call.model, call.routing)
        return tool_takers(pool, call.model) if call.needs_tools else pool

    async def relay(self, call: Call, first: bytes, write: Write) -> OpenTelaError | None:
        """Pipe a stream's chunks to `write` as they arrive; the error that broke it off, if one did.

        Each chunk is written before the next is read, and `write` waits while the client's socket is full, so
        a slow reader holds back the mesh stream (and through its flow control the engine) instead of growing
        a buffer here. A stream that breaks after the first byte resumes on another replica when it can
        (gateway/resume.py), within the request's retry budget and deadline; otherwise the failure ends the
        stream and the caller sends it as an event.
        """
        attempt = call.attempt
        assert attempt is not None and attempt.stream is not None and attempt.head is not None
        self.metrics.series(call.model, attempt.target.peer_id).ttfb.observe(
            time.perf_counter() - call.arrived
        )
        splice, chunk = call.splice, first
        while True:
            err = await self._pipe(call, attempt, chunk, write)
            call.status = str(attempt.head.status)
            if err is None:
                self._end(attempt, call.routed, ok=True)
                return None
            logger.warning(
                "stream %s from %s broke after %d bytes: %s",
                call.request_id,
                attempt.target.session_id[:8],
                call.sent,
                err,
            )
            self._end(attempt, call.routed, ok=False, err=err, reset="stream abandoned")
            resumed = await self._resume(call, err) if splice is not None else None
            if resumed is None:
                call.attempt = attempt  # the client's answer came from the replica that broke
                call.error = err
                return err
            attempt, chunk = resumed
            assert attempt.stream is not None and attempt.head is not None

    async def _pipe(self, call: Call, attempt: Attempt, chunk: bytes, write: Write) -> OpenTelaError | None:
        """Relay one upstream stream, starting with `chunk`, until it ends; the error that broke it, if any."""
        assert attempt.stream is not None
        stream, splice, events = attempt.stream, call.splice, call.events
        loop = asyncio.get_running_loop()
        deadline, idle = call.deadline, call.limits.idle_timeout
        try:
            while chunk:
                out = splice.feed(chunk) if splice is not None else chunk
                if events is not None and out:
                    out = events.feed(out)  # a Responses request served by a chat engine
                if out:
                    await write(out)
                    call.sent += len(out)
                async with asyncio.timeout_at(min(deadline, loop.time() + idle)):
                    chunk = await stream.read()
            rest = splice.flush() if splice is not None else b""
            if events is not None:
                rest = events.feed(rest) + events.close()
            if rest:
                await write(rest)
                call.sent += len(rest)
        except TimeoutError:
            return UpstreamTimeout(
                f"the stream from {attempt.target.session_id[:8]} went silent or ran past its deadline"
            )
        except (StreamResetError, ConnectionClosedError) as exc:
            return _mid_stream_error(exc)
        return None

    async def _resume(self, call: Call, err: OpenTelaError) -> tuple[Attempt, bytes] | None:
        """Continue a broken stream on a replica not yet tried: the new attempt and its first chunk, or None
        when the stream cannot resume (the client then gets `err`)."""
        splice = call.splice
        assert splice is not None
        if isinstance(err, UpstreamTimeout) and asyncio.get_running_loop().time() >= call.deadline:
            return None  # the request's own time is up, not the replica's

        candidates = functools.partial(self._eligible, call)
        original = json.loads(call.body.raw)
        while splice.can_resume and self.can_retry(candidates, call.tried, call.limits):
            body = splice.continuation(original)
            if body is None:
                return None
            payload = encode_request(
                TunnelRequest(
                    "POST",
                    splice.path,
                    json.dumps(body).encode(),
                    call.request_id,
                    splice.headers,
                    self.config.server_timing,
                )
            )
            failed = call.routed.attrs.get("failed_node", "-")
            try:
                async with asyncio.timeout_at(call.deadline):
                    attempt = call.attempt = await self.open(
                        candidates,
                        payload,
                        call.routed,
                        call.routing.policy,
                        tried=call.tried,
                        limits=call.limits,
                    )
                    assert attempt.head is not None
                    if attempt.head.status != 200 or not attempt.event_stream:
                        # A continuation the engine refused: its answer cannot be spliced into a stream.
                        self._end(attempt, call.routed, ok=False, reset="continuation refused")
                        logger.warning(
                            "stream %s: replica %s refused the continuation (%d)",
                            call.request_id,
                            attempt.target.session_id[:8],
                            attempt.head.status,
                        )
                        return None
                    try:
                        first = await self._first_chunk(attempt, call.limits)
                    except OpenTelaError as exc:
                        failure = _mid_stream_error(exc)
                        self._end(attempt, call.routed, ok=False, err=failure, reset="retrying elsewhere")
                        if not failure.retryable:
                            return None
                        continue
            except TimeoutError:
                return None
            except OpenTelaError as exc:
                logger.warning("stream %s could not resume: %s", call.request_id, exc)
                return None
            splice.restart()
            self.metrics.resumes.labels(call.model, failed).inc()
            logger.info(
                "resumed stream %s on %s after %d tokens (%s)",
                call.request_id,
                attempt.target.session_id[:8],
                splice.tokens,
                err,
            )
            return attempt, first
        return None

    def client_gone(self, call: Call) -> None:
        """The client went away: the serving node hears it, so its engine stops generating for nobody."""
        call.status = "cancelled"
        # With a whole answer in, its replica did its part: the call's close books it as served.
        if call.attempt is not None and not call.answered_at:
            self._end(call.attempt, call.routed, ok=False, reset="client disconnected")

    def close(self, call: Call, exc: BaseException | None) -> None:
        """Book the end of `call`, however it ended; an attempt still open is abandoned."""
        if isinstance(exc, OpenTelaError):
            call.status, call.error = str(exc.status_code), exc
        elif isinstance(exc, asyncio.CancelledError):
            call.status = "cancelled"
        attempt, model, node = call.attempt, call.model, call.node
        if attempt is not None:
            if call.answered_at and not attempt.finished:  # a whole answer, written (or the client gone)
                self.metrics.series(model, node).ttfb.observe(call.answered_at - call.arrived)
                assert attempt.head is not None
                ok = attempt.head.status < 500
                self._end(attempt, call.routed, ok=ok, err=None if ok else call.error)
            self._end(attempt, call.routed, ok=False, reset="request abandoned")
            series = self.metrics.series(model, node)
            series.bytes_in.inc(call.routed.body_bytes)
            series.bytes_out.inc(call.sent)
            latency = series.latency
        else:  # never reached a replica: no pair's series to keep for it
            latency = self.metrics.latency.labels(model, node)
        if call.error is not None:
            self.metrics.errors.labels(model, node, call.error.code).inc()
        self.metrics.finished(model, node, call.status).inc()
        latency.observe(time.perf_counter() - call.arrived)

    # --- attempts -------------------------------------------------------------------------------------------
    def can_retry(
        self,
        candidates: Callable[[], Sequence[NodeRecord]],
        tried: set[str],
        limits: TimeoutClass | None = None,
    ) -> bool:
        """Whether another attempt is allowed (by `limits`, else the default class) and some replica not yet
        tried is there to take it."""
        if len(tried) >= 1 + (limits or self.timeouts.default).max_retries:
            return False
        return any(c.session_id not in tried for c in candidates())

    async def open(
        self,
        candidates: Callable[[], Sequence[NodeRecord]],
        payload: bytes,
        routed: RoutedRequest,
        policy: RoutingPolicy,
        *,
        tried: set[str],
        limits: TimeoutClass | None = None,
    ) -> Attempt:
        """Return the first attempt whose replica answers with a usable response head.

        Failures before the head are retried on replicas not yet tried (never the one that just failed), for
        streaming and non-streaming requests alike: the client has seen nothing yet. An engine 5xx is retried
        the same way while another replica is left; the last one goes to the client as it is. `candidates`
        is called again before each attempt so a replica that went DOWN meanwhile is not picked; `tried`
        holds the sessions already used for this request and grows with each attempt. A replica reconfiguring
        is picked only when no replica left to try serves (`prefer_serving`). `limits` gives the first-byte
        timeout and the retry budget (default: the default class).
        """
        limits = limits or self.timeouts.default
        last_error: OpenTelaError | None = None
        while len(tried) < 1 + limits.max_retries:
            pool = prefer_serving([c for c in candidates() if c.session_id not in tried], routed.model)
            if not pool:
                break
            target = policy.pick(pool, routed)
            if not any(c.session_id == target.session_id for c in pool):
                # A policy may only choose among what it was given: that is where trust is enforced.
                raise OpenTelaError(
                    f"routing policy {type(policy).__name__} picked a replica outside its candidates"
                )
            if tried:
                self.retries += 1
                self.metrics.retries.labels(routed.model, routed.attrs.get("failed_node", "-")).inc()
                logger.info(
                    "retrying %s on %s after %s", routed.request_id, target.session_id[:8], last_error
                )
            tried.add(target.session_id)
            attempt = self._begin(target, routed, len(tried))
            try:
                err = await self._request_head(attempt, payload, limits)
            except BaseException:
                self._end(attempt, routed, ok=False, reset="request abandoned")
                raise
            if err is None:
                assert attempt.head is not None
                if not self._replica_failed(attempt.head) or not self.can_retry(candidates, tried, limits):
                    return attempt  # a usable answer, or nobody else to ask: the client gets this one
                # The node answered but its engine could not: try another replica.
                if attempt.head.error_code:
                    err = error_from_code(attempt.head.error_code, f"replica {target.session_id[:8]} failed")
                else:
                    err = EngineError(
                        f"the engine of replica {target.session_id[:8]} answered {attempt.head.status}"
                    )
            self._end(attempt, routed, ok=False, err=err, reset="retrying elsewhere")
            last_error = err
            if not err.retryable:
                break
        if last_error is None:
            # The candidates vanished between the route check and the first attempt.
            raise NoHealthyReplicaError(f"no replica of model {routed.model!r} is left to try")
        raise last_error

    def _begin(self, target: NodeRecord, routed: RoutedRequest, number: int) -> Attempt:
        self.router.started(target, routed)
        self.metrics.series(routed.model, target.peer_id).in_flight.inc()
        return Attempt(target, number, time.perf_counter())

    async def _request_head(
        self, attempt: Attempt, payload: bytes, limits: TimeoutClass
    ) -> OpenTelaError | None:
        """Send the request and read the answer's head into `attempt`; the failure, if the replica failed."""
        target = attempt.target
        try:
            attempt.stream = await self._open_stream(target, self.config.connect_timeout)
            attempt.opened_at = time.perf_counter()
            await attempt.stream.write(payload)
            await attempt.stream.write_eof()
            async with asyncio.timeout(limits.first_byte_timeout):
                attempt.head = await read_response_head(attempt.stream)
        except TimeoutError:
            return UpstreamTimeout(
                f"replica {target.session_id[:8]} sent no response head within "
                f"{limits.first_byte_timeout:g} s (timeout class {limits.name})"
            )
        except asyncio.IncompleteReadError:
            return error_from_code("engine_crashed", "serving node closed the stream before answering")
        except OpenTelaError as exc:
            return exc
        attempt.head_at = time.perf_counter()
        return None

    @staticmethod
    def _replica_failed(head: TunnelResponseHead) -> bool:
        if head.status not in RETRYABLE_STATUSES:
            return False
        return head.error_code is None or error_from_code(head.error_code, "").retryable

    def _end(
        self,
        attempt: Attempt,
        routed: RoutedRequest,
        *,
        ok: bool,
        err: OpenTelaError | None = None,
        reset: str | None = None,
    ) -> None:
        """Book the end of `attempt` with the policies, the metrics, the health tracker and the mesh; resets its
        stream first when `reset` says why. Later calls do nothing. `err` None with `ok` False: cancelled,
        which says nothing about the replica."""
        if attempt.finished:
            return
        attempt.finished = True
        target = attempt.target
        if reset is not None and attempt.stream is not None:
            attempt.stream.reset(RESET_CANCELLED, reset)  # the node stops, if it is alive
        self.router.ended(target, routed, ok=ok, latency_s=time.perf_counter() - attempt.started)
        self.metrics.series(routed.model, target.peer_id).in_flight.dec()
        if ok:
            self.router.health.succeeded(target.session_id)
            return
        if err is None:
            return
        self.metrics.attempt_errors.labels(routed.model, target.peer_id, err.code).inc()
        routed.attrs["failed_node"] = target.peer_id
        if err.code == "engine_unavailable":
            # The node says this session's engine is not running: a restarted node under the same peer id, or
            # one whose engine died. Nothing to gain from asking it again soon.
            self.router.health.cool(target.session_id)
        elif self.router.health.failed(target.session_id):
            logger.warning(
                "replica %s failed %d times in a row: cooling down for %.0f s",
                target.session_id[:8],
                self.router.health.threshold,
                self.router.health.cooldown,
            )
        if self._report is not None:
            self._report(target, err)

    async def _first_chunk(self, attempt: Attempt, limits: TimeoutClass) -> bytes:
        """The first bytes of an event stream: until they exist the request can still move elsewhere."""
        assert attempt.stream is not None
        try:
            async with asyncio.timeout(limits.first_byte_timeout):
                return await attempt.stream.read()
        except TimeoutError:
            raise UpstreamTimeout(
                f"replica {attempt.target.session_id[:8]} sent no first event within "
                f"{limits.first_byte_timeout:g} s (timeout class {limits.name})"
            ) from None
        except asyncio.IncompleteReadError:
            raise error_from_code(
                "engine_crashed", "serving node closed the stream before answering"
            ) from None

    @staticmethod
    async def _read_all(attempt: Attempt) -> bytes:
        assert attempt.stream is not None
        chunks = []
        while chunk := await attempt.stream.read():
            chunks.append(chunk)
        return b"".join(chunks)
