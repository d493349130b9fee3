"""One client request on its way through the gateway: what it asks, its attempts, and its stage times."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentela import openai_edge as edge
from opentela._types import Stream
from opentela.errors import OpenTelaError
from opentela.fabric.http_tunnel import TunnelResponseHead
from opentela.gateway.metrics import NO_NODE
from opentela.gateway.output_cap import requested_output
from opentela.gateway.policies import RoutedRequest
from opentela.gateway.prompt_prefix import PromptPrefix, prompt_prefix
from opentela.gateway.responses import ResponsesAnswer
from opentela.gateway.responses_stream import ResponsesEventStream
from opentela.gateway.resume import StreamSplice
from opentela.gateway.routing import OTELA_METADATA_KEYS, RequestRouting
from opentela.gateway.timeout_classes import TimeoutClass
from opentela.registry.record import NodeRecord

if TYPE_CHECKING:
    from opentela.gateway.forwarder import Forwarder


@dataclass(slots=True)
class ParsedBody:
    """What the gateway reads from a request body, and the body to forward."""

    model: str
    stream: bool
    metadata: dict[str, Any] | None
    """The body's routing options (trusted providers, constraints, policy), when it has any."""
    tokens: int
    raw: bytes
    asked_output: tuple[str, float] | None = None
    """The output bound the body sets (`max_completion_tokens` or `max_tokens`) and its value."""
    input_tokens: int = 0
    """Estimated prompt tokens (part of `tokens`)."""
    prefix: PromptPrefix | None = None
    """The prompt's prefix digests, when asked for."""


def parse_body(raw: bytes, *, prefix: bool = False) -> ParsedBody:
    """Apply the edge's rules to the body; routing options in `metadata` are taken out before it goes on.

    With `prefix`, also digest the prompt's prefixes (for `prefix_affinity`; other policies skip the cost)."""
    return body_of(edge.parse_body(raw), raw, prefix=prefix)


def body_of(payload: dict[str, Any], raw: bytes, *, prefix: bool = False) -> ParsedBody:
    """`parse_body` for a body already parsed into `payload` (`raw` must encode it)."""
    model, stream = edge.model_and_stream(payload)
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
    prompt = edge.estimate_input_tokens(payload)
    return ParsedBody(
        model,
        stream,
        ours,
        prompt + edge.output_allowance(payload),
        raw,
        requested_output(payload),
        prompt,
        prompt_prefix(payload) if prefix else None,
    )


@dataclass(slots=True)
class Attempt:
    """One try of a request on one replica; `finished` once its end has been booked."""

    target: NodeRecord
    number: int
    started: float
    opened_at: float = 0.0
    head_at: float = 0.0
    head: TunnelResponseHead | None = None
    stream: Stream | None = None
    finished: bool = False

    @property
    def event_stream(self) -> bool:
        """Whether the replica answers with server-sent events."""
        assert self.head is not None
        return self.head.headers.get("content-type", "").startswith(edge.SSE_CONTENT_TYPE)


@dataclass(slots=True)
class Call:
    """The state of one inference request from arrival to its last byte, owned by the `Forwarder`.

    A route uses it as a context manager: leaving the block books the request's end (status, latency, byte
    counters, any attempt still open) in one place, whatever way the block was left.
    """

    forwarder: Forwarder
    request_id: str
    body: ParsedBody
    routing: RequestRouting
    routed: RoutedRequest
    payload: bytes
    """The tunnel request, encoded once for every attempt."""
    arrived: float
    parsed_at: float
    routed_at: float
    limits: TimeoutClass
    """The timeouts and retry budget of the model's class."""
    deadline: float = 0.0
    """The loop time by which the whole answer must be out (set when dispatched)."""
    tried: set[str] = field(default_factory=set)
    pool: Sequence[NodeRecord] | None = None
    """The replicas `accept` found eligible, for the first attempt (read once)."""
    attempt: Attempt | None = None
    """The attempt whose answer the client gets, once a replica gave one."""
    status: str = "error"
    error: OpenTelaError | None = None
    """What failed for the client, if anything (raised, passed on as the last 5xx, or sent mid-stream)."""
    sent: int = 0
    answered_at: float = 0.0
    """When a whole answer was ready for the client (perf_counter); its attempt is booked when the call closes."""
    splice: StreamSplice | None = None
    """Follows a stream's events so that a break after the first byte can resume on another replica."""
    answer: ResponsesAnswer | None = None
    """A Responses request served by a chat engine: turns the chat answer into a Response."""
    events: ResponsesEventStream | None = None
    """The same, for a streamed answer: writes the Responses events as chat chunks arrive."""
    kind: str | None = None
    """The OpenAI route's kind of body (chat, completions, embeddings); None for other routes."""
    needs_tools: bool = False
    """The request asks for tool calls: only replicas that take `tools` may serve it, retries included."""

    @property
    def model(self) -> str:
        """The model the request names."""
        return self.body.model

    @property
    def node(self) -> str:
        """The peer id of the replica answering, or `NO_NODE`."""
        return self.attempt.target.peer_id if self.attempt is not None else NO_NODE

    def __enter__(self) -> Call:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.forwarder.close(self, exc)

    def server_timing(self) -> str:
        """The Server-Timing header: parse, route, open, upstream, engine, node and reply stages."""
        attempt = self.attempt
        assert attempt is not None and attempt.head is not None
        now = time.perf_counter()
        stages = [
            ("parse", self.parsed_at - self.arrived),
            ("route", self.routed_at - self.parsed_at),
            ("open", attempt.opened_at - attempt.started),
            ("upstream", attempt.head_at - attempt.opened_at),
        ]
        if attempt.head.engine_us is not None:
            stages.append(("engine", attempt.head.engine_us / 1e6))
        if attempt.head.node_us is not None:
            stages.append(("node", attempt.head.node_us / 1e6))
        stages.append(("reply", now - attempt.head_at))
        return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages)
