"""Prometheus metrics of one gateway, in a registry of its own so several gateways can share a process."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip
NO_NODE = "-"
"""The node label of a request that never reached a replica (bad input, no eligible replica)."""


@dataclass(frozen=True, slots=True)
class ReplicaSeries:
    """The per-request series of one (model, node) pair, looked up once: `labels()` validates and locks on
    every call, and a request touches five of them."""

    in_flight: Gauge
    ttfb: Histogram
    latency: Histogram
    bytes_in: Counter
    bytes_out: Counter


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

        self._series: dict[tuple[str, str], ReplicaSeries] = {}
        self._finished: dict[tuple[str, str, str], Counter] = {}

    def series(self, model: str, node: str) -> ReplicaSeries:
        """The (model, node) pair's per-request series; as many pairs as the label sets already hold."""
        found = self._series.get((model, node))
        if found is None:
            found = self._series[(model, node)] = ReplicaSeries(
                self.in_flight.labels(model, node),
                self.ttfb.labels(model, node),
                self.latency.labels(model, node),
                self.bytes_in.labels(model, node),
                self.bytes_out.labels(model, node),
            )
        return found

    def finished(self, model: str, node: str, status: str) -> Counter:
        """The requests counter of (model, node, status)."""
        key = (model, node, status)
        found = self._finished.get(key)
        if found is None:
            found = self._finished[key] = self.requests.labels(model, node, status)
        return found

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
