"""Prometheus metrics of one gateway, in a registry of its own so several gateways can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """Request counters, latency histograms and in-flight gauges, labelled by model and serving node."""

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
            "otela_errors", "Requests failed, by model and error code.", ["model", "code"], registry=r
        )
        self.retries = Counter("otela_retries", "Attempts moved to another replica.", ["model"], registry=r)
        self.in_flight = Gauge("otela_in_flight", "Requests being served now.", ["model"], registry=r)
        self.ttfb = Histogram(
            "otela_time_to_first_byte_seconds",
            "From request arrival to the response head from the serving node.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "otela_request_duration_seconds",
            "From request arrival to the last response byte.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_out = Counter(
            "otela_response_bytes", "Response body bytes sent to clients.", ["model"], registry=r
        )

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
