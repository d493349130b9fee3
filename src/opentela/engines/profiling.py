"""Measuring a performance profile against a live engine: the sweep over the grid, within a time budget.

Prefill is sampled at lengths 2^x from `min_length` up to `max_length`, each point the median time to first token of
`repeat` single requests. Decode is sampled on the grid batch 2^x (up to `max_batch`) x those lengths, each point one
burst of B concurrent requests whose median chunk gap, while all B decode, is the iteration time.

The budget keeps the grid rectangular. Lengths grow until a prefill sample takes longer than `max_sample_s` (no
longer length is tried, for prefill or decode); the decode lengths also stop at the first such sample at batch 1.
A slow sample is kept. Batches grow
until a sample in a row takes longer; that row is kept when it was the row's last point, and cut otherwise (the
points of a cut row are listed in `meta` but not in the profile). An engine that will not decode B requests at
once (fewer slots than B) ends the batch axis the same way, before B. Nothing in the profile is filled in: beyond the
last sampled row or column the profile extrapolates its end segment as it does for any query past its range.

The network is handed in as a `ProfileTarget` (an `EngineProbe` in use), so the sweep runs against a fake in tests.
"""

from __future__ import annotations

import datetime as dt
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentela.engines.profile import PerformanceProfile, powers_of_two
from opentela.engines.profile_probe import (
    BatchTooLargeError,
    DecodeRun,
    EngineProbe,
    PrefillRun,
    PromptCalibration,
)
from opentela.errors import ConfigError

DIGITS = 7
"""Times are kept to 0.1 microsecond: finer is clock noise, and it keeps the file readable."""


class ProfileTarget(Protocol):
    """What the sweep measures with: an engine serving one model, reached through timed requests."""

    base_url: str
    model: str
    max_model_len: int | None

    async def calibrate(self) -> PromptCalibration:
        """Fit prompt size to tokens (this also warms the engine up)."""
        ...

    async def prefill(self, tokens: int) -> PrefillRun:
        """Time to first token of one request of about `tokens` prompt tokens."""
        ...

    async def decode(self, batch: int, tokens: int, max_tokens: int) -> DecodeRun:
        """One decode iteration of `batch` concurrent requests of about `tokens` prompt tokens."""
        ...


@dataclass(frozen=True)
class ProfileSettings:
    """What to measure, on which engine, and how long a sample may take."""

    url: str
    """Base URL of the engine, with or without /v1."""
    model: str
    device: str = "gpu"
    hardware: str = ""
    max_length: int = 2048
    min_length: int = 64
    max_batch: int = 32
    repeat: int = 3
    """Prefill requests per length (the median counts); a decode point is one burst."""
    max_sample_s: float = 30.0
    decode_tokens: int = 64
    """Output tokens of each request of a decode burst (doubled, up to twice, when the steady phase is short)."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ConfigError(f"--device must be cpu or gpu, not {self.device!r}")
        if self.max_length < 1 or self.min_length < 1 or self.max_batch < 1:
            raise ConfigError("--max-length and --max-batch must be at least 1")
        if self.repeat < 1 or self.decode_tokens < 2:
            raise ConfigError("--repeat must be at least 1 and decode tokens at least 2")
        if self.max_sample_s <= 0:
            raise ConfigError("--max-sample-seconds must be positive")

    def lengths(self, max_model_len: int | None = None) -> tuple[int, ...]:
        """The input lengths to sample, leaving room for a decode burst's output inside the context window."""
        lengths = powers_of_two(self.max_length, min(self.min_length, self.max_length))
        if max_model_len is None:
            return lengths
        room = max_model_len - 4 * self.decode_tokens
        kept = tuple(n for n in lengths if n <= room)
        if not kept:
            raise ConfigError(
                f"the engine's context window ({max_model_len} tokens) leaves no room for a "
                f"{lengths[0]}-token prompt and {4 * self.decode_tokens} output tokens"
            )
        return kept

    def batches(self) -> tuple[int, ...]:
        """The batch sizes to sample."""
        return powers_of_two(self.max_batch)


@dataclass(frozen=True)
class Sample:
    """One measured point, as progress reports it."""

    kind: str
    """"prefill" or "decode"."""
    batch: int
    length: int
    seconds: float
    """The time to first token (prefill) or of one decode iteration."""
    prompt_tokens: int | None
    elapsed_s: float
    """Wall time the sample took, repetitions included: what the budget is checked against."""
    over_budget: bool


@dataclass
class _Sweep:
    """The points measured so far and what the budget cut."""

    settings: ProfileSettings
    lengths: tuple[int, ...]
    on_sample: Callable[[Sample], None]
    prefill: list[Sample] = field(default_factory=list)
    rows: list[list[Sample]] = field(default_factory=list)
    cut: list[Sample] = field(default_factory=list)
    batch_limit: int | None = None
    """The first batch the engine would not decode at once, if one was met."""
    started: float = field(default_factory=time.perf_counter)

    def record(self, sample: Sample) -> Sample:
        self.on_sample(sample)
        return sample

    async def measure_prefill(self, target: ProfileTarget) -> None:
        for length in self.lengths:
            started = time.perf_counter()
            runs = [await target.prefill(length) for _ in range(self.settings.repeat)]
            elapsed = time.perf_counter() - started
            counted = [r.prompt_tokens for r in runs if r.prompt_tokens is not None]
            sample = Sample(
                kind="prefill",
                batch=1,
                length=length,
                seconds=round(statistics.median(r.ttft_s for r in runs), DIGITS),
                prompt_tokens=round(statistics.median(counted)) if counted else None,
                elapsed_s=elapsed,
                over_budget=elapsed > self.settings.max_sample_s,
            )
            self.prefill.append(self.record(sample))
            if sample.over_budget:
                break

    async def measure_decode(self, target: ProfileTarget) -> None:
        columns = len(self.prefill)
        for batch in self.settings.batches():
            row: list[Sample] = []
            for length in self.lengths[:columns]:
                started = time.perf_counter()
                try:
                    run = await target.decode(batch, length, self.settings.decode_tokens)
                except BatchTooLargeError:
                    if not self.rows:
                        raise
                    # The engine's own batch limit ends the batch axis, as the budget would.
                    self.batch_limit = batch
                    self.cut.extend(row)
                    return
                elapsed = time.perf_counter() - started
                sample = Sample(
                    kind="decode",
                    batch=batch,
                    length=length,
                    seconds=round(run.iteration_s, DIGITS),
                    prompt_tokens=run.prompt_tokens,
                    elapsed_s=elapsed,
                    over_budget=elapsed > self.settings.max_sample_s,
                )
                row.append(self.record(sample))
                if sample.over_budget:
                    break
            over_budget = row[-1].over_budget
            if not self.rows:
                columns = len(row)  # the cheapest row sets how far lengths go
            elif len(row) < columns:
                self.cut.extend(row)
                return
            self.rows.append(row)
            if over_budget and len(self.rows) > 1:
                return

    def profile(self, target: ProfileTarget, calibration: PromptCalibration) -> PerformanceProfile:
        s = self.settings
        nominal = tuple(p.length for p in self.prefill)
        counted = [p.prompt_tokens for p in self.prefill]
        real = tuple(n for n in counted if n is not None)
        # The engine's own counts are the better axis, as long as each length still tops the one before.
        use_real = (
            len(real) == len(nominal) and all(a < b for a, b in itertools.pairwise(real)) and real[0] > 0
        )
        columns = len(self.rows[0])
        meta: dict[str, Any] = {
            "engine_url": target.base_url,
            "engine_model": target.model,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "prefill_repeat": s.repeat,
            "decode_bursts_per_point": 1,
            "decode_tokens": s.decode_tokens,
            "max_sample_s": s.max_sample_s,
            "requested": {"lengths": list(self.lengths), "batches": list(s.batches())},
            "prefill_lengths": "reported by the engine" if use_real else "estimated",
            "prompt_tokens": {
                "prefill": counted,
                "decode": [[p.prompt_tokens for p in row] for row in self.rows],
            },
            "calibration": {
                "overhead": round(calibration.overhead, 2),
                "per_word": round(calibration.per_word, 4),
                "reported": calibration.reported,
            },
            "measured": {
                "prefill": list(nominal),
                "decode": [[p.batch, p.length] for row in self.rows for p in row],
                "cut": [[p.batch, p.length] for p in self.cut],
            },
            "batch_limit": self.batch_limit,
            "truncated": columns < len(self.lengths) or len(self.rows) < len(s.batches()),
            "elapsed_s": round(time.perf_counter() - self.started, 1),
        }
        return PerformanceProfile(
            model=s.model,
            hardware=s.hardware or s.device,
            device=s.device,
            prefill_lengths=real if use_real else nominal,
            prefill_s=tuple(p.seconds for p in self.prefill),
            decode_batches=tuple(row[0].batch for row in self.rows),
            decode_lengths=nominal[:columns],
            decode_s=tuple(tuple(p.seconds for p in row) for row in self.rows),
            source="measured",
            meta=meta,
        )


async def measure_profile(
    settings: ProfileSettings,
    target: ProfileTarget,
    on_sample: Callable[[Sample], None] = lambda sample: None,
) -> PerformanceProfile:
    """Sweep prefill, then the decode grid, against `target`, reporting each sample as it is measured."""
    sweep = _Sweep(settings, settings.lengths(target.max_model_len), on_sample)
    calibration = await target.calibrate()
    await target.prefill(sweep.lengths[0])  # warm-up: the first timed request pays for nothing else
    await sweep.measure_prefill(target)
    await sweep.measure_decode(target)
    return sweep.profile(target, calibration)


async def profile_engine(
    settings: ProfileSettings, on_sample: Callable[[Sample], None] = lambda sample: None
) -> PerformanceProfile:
    """Measure a profile of `settings.model` on the engine at `settings.url`."""
    probe = await EngineProbe.create(
        settings.url, settings.model, read_timeout_s=max(120.0, settings.max_sample_s)
    )
    async with probe:
        return await measure_profile(settings, probe, on_sample)


__all__ = ["ProfileSettings", "ProfileTarget", "Sample", "measure_profile", "profile_engine"]
