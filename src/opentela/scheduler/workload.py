"""Workloads: arrival rate and input/output length distributions per model, and the request traces they yield."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from opentela.errors import ConfigError


@dataclass(frozen=True)
class LengthDist:
    """Token lengths drawn from a normal distribution, rounded and clipped to [low, high]."""

    mean: float
    std: float = 0.0
    low: int = 1
    high: int = 1 << 20

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths as int64."""
        values = rng.normal(self.mean, self.std, n) if self.std > 0 else np.full(n, self.mean)
        return np.clip(np.rint(values), self.low, self.high).astype(np.int64)

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


def load_trace(path: str | Path) -> Trace:
    """A trace from CSV (columns arrival,input,output[,model]) or JSON lines with those keys; model is an index."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from None
    if path.suffix in (".jsonl", ".json"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = list(csv.DictReader(text.splitlines()))
    try:
        arrival = np.array([float(r["arrival"]) for r in rows])
        inp = np.array([int(r["input"]) for r in rows], dtype=np.int64)
        out = np.array([int(r["output"]) for r in rows], dtype=np.int64)
        model = np.array([int(r.get("model", 0) or 0) for r in rows], dtype=np.int64)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"trace {path}: each row needs arrival, input, output: {exc}") from None
    order = np.argsort(arrival, kind="stable")
    return Trace(arrival[order], inp[order], out[order], model[order])


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
