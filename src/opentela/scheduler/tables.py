"""Latency tables: the simulator's mean end-to-end latency of one replica as a function of its arrival rate."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device
from opentela.scheduler.models import ModelSpec
from opentela.scheduler.roofline import Precision
from opentela.scheduler.simulator import EngineLimits, ReplicaSpec, simulate
from opentela.scheduler.workload import Trace, Workload, poisson_trace

TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class SimSettings:
    """How much simulated traffic backs each latency estimate."""

    horizon_s: float = 20.0
    """Seconds of arrivals simulated per estimate."""
    min_requests: int = 150
    """At least this many requests, however low the rate."""
    max_requests: int = 1500
    """At most this many requests, however high the rate (bounds the cost of hopeless candidates)."""
    rate_points: int = 20
    """Rates per latency table, spaced geometrically."""
    seed: int = 0


@dataclass
class LatencyTable:
    """Mean E2E latency of one replica of (model, device, tp) at per-replica rates, interpolated in log-log."""

    rates: np.ndarray
    e2e: np.ndarray
    capacity_rps: float

    def __call__(self, rate: float) -> float:
        """Mean end-to-end latency (s) at `rate` requests per second per replica."""
        if rate <= 0:
            return 0.0
        x = np.log(self.rates)
        y = np.log(self.e2e)
        lr = np.log(rate)
        if lr >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if len(x) > 1 else 1.0
            return float(np.exp(y[-1] + max(slope, 1.0) * (lr - x[-1])))
        return float(np.exp(np.interp(lr, x, y)))


@dataclass
class TableBuilder:
    """Builds and caches latency tables; counts simulator evaluations and their wall time."""

    limits: EngineLimits = field(default_factory=EngineLimits)
    precision: Precision = field(default_factory=Precision)
    settings: SimSettings = field(default_factory=SimSettings)
    evaluations: int = 0
    seconds: float = 0.0
    _traces: dict[int, Trace] = field(default_factory=dict)
    _tables: dict[tuple[str, str, int], LatencyTable] = field(default_factory=dict)

    def replica(self, model: ModelSpec, device: Device, tp: int) -> ReplicaSpec:
        """The replica spec under this builder's limits and precision."""
        return ReplicaSpec(model, device, tp, self.precision, self.limits)

    def fits(self, model: ModelSpec, device: Device, tp: int, workload: Workload) -> bool:
        """C2 per replica: weights plus KV cache for eight mean-length requests fit on `tp` devices."""
        if tp > device.devices_per_node or (tp > 1 and device.link_bandwidth <= 0):
            return False
        if model.num_heads % tp:
            return False
        need = 8 * (workload.input.mean + workload.output.mean)
        return self.replica(model, device, tp).kv_capacity_tokens >= max(need, 1024)

    def base_trace(self, index: int, workload: Workload) -> Trace:
        """A rate-1 trace for `workload`, scaled to other rates (common random numbers across candidates)."""
        if index not in self._traces:
            rng = np.random.default_rng(self.settings.seed + index)
            n = self.settings.max_requests
            unit = Workload(workload.model, 1.0, workload.input, workload.output)
            self._traces[index] = poisson_trace([unit], n * 1.2, rng)
        return self._traces[index]

    def mean_e2e(self, spec: ReplicaSpec, base: Trace, rate: float) -> float:
        """The simulator's mean E2E for one replica at `rate` (one evaluation)."""
        s = self.settings
        count = int(np.clip(rate * s.horizon_s, s.min_requests, min(s.max_requests, len(base))))
        trace = base.scaled(rate)
        trace = Trace(
            trace.arrival[:count], trace.input_len[:count], trace.output_len[:count], trace.model[:count] * 0
        )
        started = time.perf_counter()
        result = simulate([spec], trace)
        self.seconds += time.perf_counter() - started
        self.evaluations += 1
        e2e = result.e2e
        if np.isnan(e2e).any():
            raise ConfigError(f"{spec.model.name} on {spec.device.name}: requests too long for the KV cache")
        return float(e2e.mean())

    def capacity(self, spec: ReplicaSpec, base: Trace) -> float:
        """Saturated throughput (requests/s) of one replica: every request queued at time zero."""
        count = min(self.settings.min_requests * 2, len(base))
        burst = Trace(
            np.zeros(count), base.input_len[:count], base.output_len[:count], base.model[:count] * 0
        )
        started = time.perf_counter()
        result = simulate([spec], burst)
        self.seconds += time.perf_counter() - started
        self.evaluations += 1
        return count / float(np.nanmax(result.finish))

    def table(
        self,
        index: int,
        workload: Workload,
        model: ModelSpec,
        device: Device,
        tp: int,
        max_rate: float,
        on_eval: Callable[[], None] | None = None,
    ) -> LatencyTable:
        """The latency table of (model, device, tp) for rates up to `max_rate` per replica."""
        key = (model.name, device.name, tp)
        if key in self._tables:
            return self._tables[key]
        spec = self.replica(model, device, tp)
        base = self.base_trace(index, workload)
        capacity = self.capacity(spec, base)
        low = max(min(capacity, max_rate) / 50, 1e-3)
        high = max(max_rate, low * 2)
        rates = np.geomspace(low, high, self.settings.rate_points)
        e2e = []
        for r in rates:
            e2e.append(self.mean_e2e(spec, base, float(r)))
            if on_eval:
                on_eval()
        # Queueing only adds delay: enforce monotonicity against sampling noise.
        table = LatencyTable(rates, np.maximum.accumulate(np.array(e2e)), capacity)
        self._tables[key] = table
        return table

    @property
    def evaluations_per_minute(self) -> float:
        """Simulator evaluations per minute of wall time spent simulating."""
        return 60.0 * self.evaluations / self.seconds if self.seconds else 0.0
