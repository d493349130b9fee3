"""Settings of the ingress HTTP gateway."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GatewayConfig:
    """How the ingress listens, limits, times out and retries."""

    http: str = field(
        default="127.0.0.1:8092", metadata={"help": "HOST:PORT the OpenAI-compatible API listens on."}
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "Largest request body accepted; larger ones get 413."}
    )
    policy: str = field(
        default="random", metadata={"help": "Routing policy: a built-in name or an operator's module:Class."}
    )
    connect_timeout: float = field(
        default=5.0, metadata={"help": "Seconds to open a stream to the serving node (dial included)."}
    )
    first_byte_timeout: float = field(
        default=300.0, metadata={"help": "Seconds to wait for the response head from the serving node."}
    )
    total_timeout: float = field(
        default=900.0, metadata={"help": "Absolute deadline of one request, in seconds."}
    )
    max_retries: int = field(
        default=2,
        metadata={"help": "Other replicas tried after a transport or engine failure (non-streaming)."},
    )
