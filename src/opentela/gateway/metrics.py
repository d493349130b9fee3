"""Prometheus metrics of one gateway, in a registry of its own so several gateways can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip
NO_NODE = "-"
"""The node label of a request that never reached a replica (bad input, no eligible replica)."""


class GatewayMetrics:
    """Request counters, latency histograms, byte counters and in-flight gauges, by model and serving node.

    The node label is the peer id, which survives restarts, so churn does not grow the label set.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "otela_requests",
            "Requests finished, by model, node and status.",
            ["model", "node", "status"],
            registry=r,
        )
        self.errors = Counter(
            "otela_errors",
            "Requests that failed for the client, by model, node and error code.",
            ["model", "node", "code"],
            registry=r,
        )
        self.attempt_errors = Counter(
            "otela_attempt_failures",
            "Attempts on a replica that failed (retried or not), by error code.",
            ["model", "node", "code"],
            registry=r,
        )
        self.retries = Counter(
            "otela_retries",
            "Attempts moved to another replica, by the node that failed.",
            ["model", "node"],
            registry=r,
        )
        self.resumes = Counter(
            "otela_stream_resumes",
            "Streams continued on another replica after breaking mid-response, by the node that failed.",
            ["model", "node"],
            registry=r,
        )
        self.in_flight = Gauge("otela_in_flight", "Attempts being served now.", ["model", "node"], registry=r)
        self.ttfb = Histogram(
            "otela_time_to_first_byte_seconds",
            "From request arrival to the first response byte sent to the client.",
            ["model", "node"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "otela_request_duration_seconds",
            "From request arrival to the last response byte.",
            ["model", "node"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter(
            "otela_request_bytes", "Request body bytes forwarded to replicas.", ["model", "node"], registry=r
        )
        self.bytes_out = Counter(
            "otela_response_bytes", "Response body bytes sent to clients.", ["model", "node"], registry=r
        )  # fmt: skip

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
