"""Dispatch: choose a replica, open a tunnel stream to it, and retry elsewhere while the client has seen nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentela._types import Stream
from opentela.errors import (
    EngineError,
    NoHealthyReplicaError,
    OpenTelaError,
    UpstreamTimeout,
    error_from_code,
)
from opentela.fabric.http_tunnel import RESET_CANCELLED, TunnelResponseHead, read_response_head
from opentela.gateway._config import GatewayConfig
from opentela.gateway.metrics import GatewayMetrics
from opentela.gateway.policies import RoutedRequest, RoutingPolicy
from opentela.gateway.routing import Router
from opentela.registry.record import NodeRecord

logger = logging.getLogger(__name__)

OpenStream = Callable[[NodeRecord, float], Awaitable[Stream]]
"""Opens a /otela/http/1 stream to the node of a record within a timeout (seconds)."""
OnFailure = Callable[[NodeRecord, OpenTelaError], None]

RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})
"""Engine answers worth another replica: it failed, not the request (501/505 would fail anywhere)."""


@dataclass(slots=True)
class Upstream:
    """A replica that accepted the request: its response head, and the stream its body arrives on."""

    target: NodeRecord
    head: TunnelResponseHead
    stream: Stream
    attempts: int
    started: float
    head_at: float
    opened_at: float
    finished: bool = False


class Forwarder:
    """Sends one request to one replica at a time, moving to another replica when the failure allows it.

    Every attempt is booked exactly once: `Router.started` when it begins, `Router.ended` (through `fail`
    or `finish`) when it ends, and the health tracker hears the outcome.
    """

    def __init__(
        self, config: GatewayConfig, router: Router, open_stream: OpenStream, metrics: GatewayMetrics
    ) -> None:
        self.config = config
        self.router = router
        self._open_stream = open_stream
        self.metrics = metrics
        self.retries = 0

    @property
    def policy(self) -> RoutingPolicy:
        """The ingress's default policy."""
        return self.router.default_policy

    def can_retry(self, candidates: Callable[[], Sequence[NodeRecord]], tried: set[str]) -> bool:
        """Whether another attempt is allowed and some replica not yet tried is there to take it."""
        if len(tried) >= 1 + self.config.max_retries:
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
        on_failure: OnFailure | None = None,
    ) -> Upstream:
        """Return the first replica that answers with a usable response head.

        Failures before the head are retried on replicas not yet tried (never the one that just failed), for
        streaming and non-streaming requests alike: the client has seen nothing yet. An engine 5xx is retried
        the same way while another replica is left; the last one goes to the client as it is. `candidates`
        is called again before each attempt so a replica that went DOWN meanwhile is not picked; `tried`
        holds the sessions already used for this request and grows with each attempt.
        """
        last_error: OpenTelaError | None = None
        while len(tried) < 1 + self.config.max_retries:
            attempt = len(tried)
            pool = [c for c in candidates() if c.session_id not in tried]
            if not pool:
                break
            target = policy.pick(pool, routed)
            if not any(c.session_id == target.session_id for c in pool):
                # A policy may only choose among what it was given: that is where trust is enforced.
                raise OpenTelaError(
                    f"routing policy {type(policy).__name__} picked a replica outside its candidates"
                )
            tried.add(target.session_id)
            if attempt:
                self.retries += 1
                self.metrics.retries.labels(routed.model, routed.attrs.get("failed_node", "-")).inc()
                logger.info(
                    "retrying %s on %s after %s", routed.request_id, target.session_id[:8], last_error
                )
            started = time.perf_counter()
            self.router.started(target, routed)
            self.metrics.in_flight.labels(routed.model, target.peer_id).inc()
            try:
                stream = await self._open_stream(target, self.config.connect_timeout)
                opened = time.perf_counter()
                try:
                    await stream.write(payload)
                    await stream.write_eof()
                    async with asyncio.timeout(self.config.first_byte_timeout):
                        head = await read_response_head(stream)
                except BaseException:
                    stream.reset(RESET_CANCELLED, "request abandoned")
                    raise
            except TimeoutError:
                err: OpenTelaError = UpstreamTimeout(f"replica {target.session_id[:8]} sent no response head")
            except asyncio.IncompleteReadError:
                err = error_from_code("engine_crashed", "serving node closed the stream before answering")
            except OpenTelaError as exc:
                err = exc
            except BaseException:
                self.fail(target, routed, None, started, None)
                raise
            else:
                upstream = Upstream(target, head, stream, attempt + 1, started, time.perf_counter(), opened)
                if not self._replica_failed(head):
                    return upstream
                if not self.can_retry(candidates, tried):
                    return upstream  # nobody else to ask: the client gets this replica's answer
                # The node answered but its engine could not: try another replica.
                stream.reset(RESET_CANCELLED, "retrying elsewhere")
                if head.error_code:
                    err = error_from_code(head.error_code, f"replica {target.session_id[:8]} failed")
                else:
                    err = EngineError(f"the engine of replica {target.session_id[:8]} answered {head.status}")
            self.fail(target, routed, err, started, on_failure)
            last_error = err
            if not err.retryable:
                break
        if last_error is None:
            # The candidates vanished between the route check and the first attempt.
            raise NoHealthyReplicaError(f"no replica of model {routed.model!r} is left to try")
        raise last_error

    @staticmethod
    def _replica_failed(head: TunnelResponseHead) -> bool:
        if head.status not in RETRYABLE_STATUSES:
            return False
        return head.error_code is None or error_from_code(head.error_code, "").retryable

    def fail(
        self,
        target: NodeRecord,
        routed: RoutedRequest,
        err: OpenTelaError | None,
        started: float,
        on_failure: OnFailure | None,
    ) -> None:
        """Book a failed attempt with the policies, the metrics and the health tracker."""
        self.router.ended(target, routed, ok=False, latency_s=time.perf_counter() - started)
        self.metrics.in_flight.labels(routed.model, target.peer_id).dec()
        if err is None:
            return  # cancelled: says nothing about the replica
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
        if on_failure is not None:
            on_failure(target, err)

    def finish(
        self,
        upstream: Upstream,
        routed: RoutedRequest,
        *,
        ok: bool,
        err: OpenTelaError | None = None,
        on_failure: OnFailure | None = None,
    ) -> None:
        """Book the end of the attempt that produced `upstream`; later calls do nothing."""
        if upstream.finished:
            return
        upstream.finished = True
        if ok:
            self.router.ended(
                upstream.target, routed, ok=True, latency_s=time.perf_counter() - upstream.started
            )
            self.metrics.in_flight.labels(routed.model, upstream.target.peer_id).dec()
            self.router.health.succeeded(upstream.target.session_id)
        else:
            self.fail(upstream.target, routed, err, upstream.started, on_failure)
