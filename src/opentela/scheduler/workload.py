"""Workloads: arrival rate and input/output length distributions per model, and the request traces they yield."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from opentela.bench.traces import TraceRecord, read_trace
from opentela.errors import ConfigError


@dataclass(frozen=True)
class LengthDist:
    """Token lengths drawn from a normal distribution, rounded and clipped to [low, high].

    Built from a trace (`empirical`), it draws from the trace's own lengths instead, through their quantiles;
    `mean` and `std` are then the trace's, for the placement's memory estimates.
    """

    mean: float
    std: float = 0.0
    low: int = 1
    high: int = 1 << 20
    quantiles: tuple[float, ...] = ()
    """Evenly spaced quantiles (the 0th to the 100th percentile) of observed lengths; empty: normal."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths as int64."""
        if self.quantiles:
            grid = np.linspace(0.0, 1.0, len(self.quantiles))
            values = np.interp(rng.uniform(0.0, 1.0, n), grid, self.quantiles)
        elif self.std > 0:
            values = rng.normal(self.mean, self.std, n)
        else:
            values = np.full(n, self.mean)
        return np.clip(np.rint(values), self.low, self.high).astype(np.int64)

    @property
    def median(self) -> float:
        """The median length (the mean for a normal distribution)."""
        if not self.quantiles:
            return self.mean
        return float(np.interp(0.5, np.linspace(0.0, 1.0, len(self.quantiles)), self.quantiles))

    @classmethod
    def empirical(cls, lengths: Sequence[int] | np.ndarray, points: int = 101) -> LengthDist:
        """The distribution of observed lengths, kept as `points` quantiles (bimodal shapes survive)."""
        values = np.asarray(lengths, dtype=np.float64)
        if values.size == 0:
            raise ConfigError("an empirical length distribution needs at least one length")
        q = np.quantile(values, np.linspace(0.0, 1.0, points))
        return cls(float(values.mean()), float(values.std()), quantiles=tuple(float(v) for v in q))

    @classmethod
    def parse(cls, raw: Any, where: str) -> LengthDist:
        """A number (fixed length) or a mapping with mean, std, and optional low/high."""
        if isinstance(raw, int | float):
            return cls(float(raw))
        if isinstance(raw, Mapping) and "mean" in raw:
            unknown = set(raw) - {"mean", "std", "low", "high"}
            if unknown:
                raise ConfigError(f"{where}: unknown length fields {sorted(unknown)}")
            return cls(
                float(raw["mean"]),
                float(raw.get("std", 0.0)),
                int(raw.get("low", 1)),
                int(raw.get("high", 1 << 20)),
            )
        raise ConfigError(f"{where}: a length is a number or {{mean, std, low, high}}, got {raw!r}")


@dataclass(frozen=True)
class Workload:
    """Requests for one model: Poisson arrivals at `rate` per second with the given length distributions."""

    model: str
    rate: float
    input: LengthDist
    output: LengthDist


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival: arrival time (s), prompt and output lengths, and the model index."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    model: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)

    def scaled(self, factor: float) -> Trace:
        """The same requests arriving `factor` times faster (common random numbers across rates)."""
        return Trace(self.arrival / factor, self.input_len, self.output_len, self.model)

    def only(self, model: int) -> Trace:
        """The requests of one model."""
        keep = self.model == model
        return Trace(self.arrival[keep], self.input_len[keep], self.output_len[keep], self.model[keep])


def poisson_trace(
    workloads: Sequence[Workload], duration: float, rng: np.random.Generator, max_requests: int = 1 << 22
) -> Trace:
    """Independent Poisson streams, one per workload (model index = position), over `duration` seconds."""
    parts = []
    for index, w in enumerate(workloads):
        if w.rate <= 0:
            continue
        n = min(int(rng.poisson(w.rate * duration)), max_requests)
        arrival = np.sort(rng.uniform(0.0, duration, n))
        parts.append((arrival, w.input.sample(rng, n), w.output.sample(rng, n), np.full(n, index)))
    if not parts:
        empty = np.zeros(0)
        return Trace(empty, empty.astype(np.int64), empty.astype(np.int64), empty.astype(np.int64))
    arrival, inp, out, model = (np.concatenate(x) for x in zip(*parts, strict=True))
    order = np.argsort(arrival, kind="stable")
    return Trace(arrival[order], inp[order], out[order], model[order])


def trace_from_records(records: Sequence[TraceRecord], models: Mapping[str, int] | None = None) -> Trace:
    """The simulator's trace of `records`, arrivals shifted to start at 0.

    `models` maps model names to indices (names it lacks are dropped); by default indices follow first
    appearance, except that the index-named models of old ``arrival,input,output,model`` files keep their index.
    """
    if models is None:
        names = list(dict.fromkeys(r.model for r in records))
        legacy = all(n.isdigit() for n in names)
        models = {n: int(n) if legacy else i for i, n in enumerate(names)}
    kept = [r for r in records if r.model in models]
    start = min((r.timestamp for r in kept), default=0.0)
    arrival = np.array([r.timestamp - start for r in kept], dtype=np.float64)
    inp = np.array([r.input_tokens for r in kept], dtype=np.int64)
    out = np.array([r.output_tokens for r in kept], dtype=np.int64)
    model = np.array([models[r.model] for r in kept], dtype=np.int64)
    order = np.argsort(arrival, kind="stable")
    return Trace(arrival[order], inp[order], out[order], model[order])


def load_trace(path: str | Path, *, fmt: str = "auto", models: Mapping[str, int] | None = None) -> Trace:
    """A trace file in any format `read_trace` reads (docs/traces.md) as the simulator's `Trace`."""
    return trace_from_records(read_trace(path, fmt), models)


def workloads_from_trace(records: Sequence[TraceRecord], *, speedup: float = 1.0) -> list[Workload]:
    """One workload per model of the trace (first appearance first): its rate and empirical lengths.

    The rate is the model's requests over the whole trace's duration, times `speedup`, so that a model active
    for a day of a week-long trace gets its share of the week.
    """
    if len(records) < 2 or speedup <= 0:
        raise ConfigError("a workload needs a trace of at least two requests (and a positive speedup)")
    times = [r.timestamp for r in records]
    duration = max(times) - min(times)
    if duration <= 0:
        raise ConfigError("the trace's requests all arrive at once: no rate can be derived from it")
    by_model: dict[str, list[TraceRecord]] = {}
    for r in records:
        by_model.setdefault(r.model, []).append(r)
    return [
        Workload(
            model,
            len(rows) / duration * speedup,
            LengthDist.empirical([r.input_tokens for r in rows]),
            LengthDist.empirical([r.output_tokens for r in rows]),
        )
        for model, rows in by_model.items()
    ]


def load_workloads(path: str | Path) -> list[Workload]:
    """A workload file (YAML or JSON): ``models: [{model, rate, input, output}, ...]``."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read workload file {path}: {exc}") from None
    entries = raw.get("models") if isinstance(raw, Mapping) else raw
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a non-empty list under 'models'")
    out = []
    for i, e in enumerate(entries):
        where = f"{path}: models[{i}]"
        if not isinstance(e, Mapping) or not {"model", "rate", "input", "output"} <= set(e):
            raise ConfigError(f"{where}: needs model, rate, input and output")
        rate = float(e["rate"])
        if rate < 0:
            raise ConfigError(f"{where}: rate must be >= 0")
        out.append(
            Workload(
                str(e["model"]),
                rate,
                LengthDist.parse(e["input"], where + ".input"),
                LengthDist.parse(e["output"], where + ".output"),
            )
        )
    return out
