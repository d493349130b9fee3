"""Dispatch: choose a replica, open a tunnel stream to it, and retry elsewhere when that is safe."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentela._types import Stream
from opentela.errors import (
    OpenTelaError,
    UpstreamTimeout,
    error_from_code,
)
from opentela.fabric.http_tunnel import (
    RESET_CANCELLED,
    TunnelRequest,
    TunnelResponseHead,
    encode_request,
    read_response_head,
)
from opentela.gateway._config import GatewayConfig
from opentela.gateway.policies import RoutedRequest, RoutingPolicy
from opentela.registry.record import NodeRecord

logger = logging.getLogger(__name__)

OpenStream = Callable[[NodeRecord, float], Awaitable[Stream]]
"""Opens a /otela/http/1 stream to the node of a record within a timeout (seconds)."""


@dataclass(slots=True)
class Upstream:
    """A replica that accepted the request: its response head, and the stream its body arrives on."""

    target: NodeRecord
    head: TunnelResponseHead
    stream: Stream
    attempts: int
    started: float


class Forwarder:
    """Sends one request to one replica at a time, moving to another replica when the failure allows it."""

    def __init__(self, config: GatewayConfig, policy: RoutingPolicy, open_stream: OpenStream) -> None:
        self.config = config
        self.policy = policy
        self._open_stream = open_stream
        self.retries = 0

    async def open(
        self,
        candidates: Callable[[], Sequence[NodeRecord]],
        tunnel: TunnelRequest,
        routed: RoutedRequest,
        *,
        tried: set[str],
        on_failure: Callable[[NodeRecord, OpenTelaError], None] | None = None,
    ) -> Upstream:
        """Return the first replica that answers with a usable response head.

        Failures before the head are retried on replicas not yet tried (never the one that just failed), for
        streaming and non-streaming requests alike: the client has seen nothing yet. `candidates` is called
        again before each attempt so a replica that went DOWN meanwhile is not picked. `tried` holds the
        sessions already used for this request (across calls) and grows with each attempt.
        """
        payload = encode_request(tunnel)
        last_error: OpenTelaError | None = None
        while len(tried) < 1 + self.config.max_retries:
            attempt = len(tried)
            pool = [c for c in candidates() if c.session_id not in tried]
            if not pool:
                break
            target = self.policy.pick(pool, routed)
            tried.add(target.session_id)
            if attempt:
                self.retries += 1
                logger.info(
                    "retrying %s on %s after %s", tunnel.request_id, target.session_id[:8], last_error
                )
            started = time.perf_counter()
            self.policy.on_request_start(target, routed)
            try:
                stream = await self._open_stream(target, self.config.connect_timeout)
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
            else:
                if head.error_code and head.status >= 500 and error_from_code(head.error_code, "").retryable:
                    # The node answered but its engine could not: say so, and try another replica.
                    stream.reset(RESET_CANCELLED, "retrying elsewhere")
                    err = error_from_code(head.error_code, f"replica {target.session_id[:8]} failed")
                else:
                    return Upstream(target, head, stream, attempt + 1, started)
            self.fail(target, routed, err, started, on_failure)
            last_error = err
            if not err.retryable:
                break
        if last_error is None:
            raise RuntimeError("Forwarder.open found no candidate to try")
        raise last_error

    def fail(
        self,
        target: NodeRecord,
        routed: RoutedRequest,
        err: OpenTelaError,
        started: float,
        on_failure: Callable[[NodeRecord, OpenTelaError], None] | None,
    ) -> None:
        """Book a failed attempt with the policy and the health tracker."""
        self.policy.on_request_end(target, routed, ok=False, latency_s=time.perf_counter() - started)
        if on_failure is not None:
            on_failure(target, err)
