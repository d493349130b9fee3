"""Workload drift: traffic measured from recent usage against the traffic the current plan was made with.

The fleet controller plans with each model's rate and input/output lengths. With a usage feed it measures them
from the requests of a recent window (`measure`). A model's first measurement replaces its declared traffic; a
later one replaces the traffic the current plan was made with only when it differs enough (`DriftRule`), at
most once per cool-down, so that sampling noise never moves the plan back and forth (`WorkloadTracker`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from opentela.bench.traces import TraceRecord
from opentela.scheduler.workload import LengthDist, Workload

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftRule:
    """When measured traffic differs enough from the planned traffic to plan again."""

    rate: float = 0.3
    """Re-plan when a model's request rate changed by more than this share of the planned rate (0.3: 30 %)."""
    length: float = 0.5
    """Re-plan when a model's median input or output length changed by more than this share (0.5: 50 %)."""
    min_samples: int = 30
    """Requests a model needs in the window before its measurement counts (fewer: it keeps its planned traffic)."""
    cooldown_s: float = 600.0
    """Seconds after a re-plan during which further drift waits (so that the plan does not flap)."""


@dataclass(frozen=True)
class Measurement:
    """One model's traffic in the window: its workload (rate, empirical lengths) and the requests it rests on."""

    workload: Workload
    samples: int


def measure(records: Sequence[TraceRecord], *, window_s: float, now: float) -> dict[str, Measurement]:
    """Per model of `records`, its rate and empirical lengths over the requests of ``[now - window_s, now]``.

    A model's rate is its requests after its first one in the window over the time since that first one, so a
    window not yet full (a frontend restarted a minute ago, a model first requested ten minutes ago) gives the
    current rate instead of one diluted by the empty part of the window.
    """
    now = max([now, *(r.timestamp for r in records)])
    by_model: dict[str, list[TraceRecord]] = {}
    for r in records:
        if now - window_s <= r.timestamp <= now:
            by_model.setdefault(r.model, []).append(r)
    out = {}
    for model, rows in by_model.items():
        first = min(r.timestamp for r in rows)
        rate = (len(rows) - 1) / max(now - first, 1e-3)
        workload = Workload(
            model,
            rate,
            LengthDist.empirical([r.input_tokens for r in rows]),
            LengthDist.empirical([r.output_tokens for r in rows]),
        )
        out[model] = Measurement(workload, len(rows))
    return out


def _change(old: float, new: float) -> float:
    """Relative change from `old` to `new` (infinite when traffic appears where none was planned)."""
    if old <= 0:
        return math.inf if new > 0 else 0.0
    return abs(new - old) / old


def _pct(old: float, new: float) -> str:
    return "new" if old <= 0 else f"{new / old - 1:+.0%}"


def drift_reasons(planned: Workload, measured: Workload, rule: DriftRule) -> list[str]:
    """Why `measured` differs enough from `planned` to plan again; empty when it does not."""
    reasons = []
    if _change(planned.rate, measured.rate) > rule.rate:
        reasons.append(
            f"rate {planned.rate:.3g} -> {measured.rate:.3g} req/s ({_pct(planned.rate, measured.rate)})"
        )
    for name, old, new in (
        ("input", planned.input.median, measured.input.median),
        ("output", planned.output.median, measured.output.median),
    ):
        if _change(old, new) > rule.length:
            reasons.append(f"median {name} {old:.0f} -> {new:.0f} tokens ({_pct(old, new)})")
    return reasons


@dataclass(frozen=True)
class Replan:
    """A decision to plan again: the models that drifted and why, and every measurement the new plan adopts."""

    reasons: Mapping[str, tuple[str, ...]]
    adopted: Mapping[str, Measurement] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: each drifted model with its reasons."""
        return "; ".join(f"{m}: {', '.join(r)}" for m, r in self.reasons.items())


class WorkloadTracker:
    """The workloads the current plan is made with, replaced by measured ones when they drift (`DriftRule`)."""

    def __init__(self, planned: Iterable[Workload], rule: DriftRule | None = None) -> None:
        self.rule = rule or DriftRule()
        self.planned: dict[str, Workload] = {w.model: w for w in planned}
        """Model -> the traffic the current plan was made with (declared until a measurement is adopted)."""
        self.adopted: dict[str, Workload] = {}
        """Model -> the measured traffic adopted at the last re-plan (the models that had enough samples)."""
        self.replanned_at: float | None = None

    def __repr__(self) -> str:
        return f"<WorkloadTracker models={len(self.planned)} adopted={len(self.adopted)}>"

    def drifted(self, measured: Mapping[str, Measurement]) -> dict[str, tuple[str, ...]]:
        """The models with enough samples whose measurement drifted from the plan, with the reasons."""
        out = {}
        for model, m in measured.items():
            if model in self.planned and m.samples >= self.rule.min_samples:
                reasons = drift_reasons(self.planned[model], m.workload, self.rule)
                if reasons:
                    out[model] = tuple(reasons)
        return out

    def observe(self, measured: Mapping[str, Measurement], now: float) -> Replan | None:
        """Adopt measured traffic; a Replan when it drifted from the plan's, None when the plans may stay.

        A model's first measurement with enough samples replaces its declared traffic at once: quietly when it is
        within the thresholds, as a re-plan when it drifted, cool-down or not (a first measurement cannot flap).
        Later, a drift re-plans once the cool-down is over, and a re-plan adopts the measurement of every model
        with enough samples, drifted or not, so that the new plan is made with the freshest traffic of all.
        """
        enough = {
            model: m
            for model, m in measured.items()
            if model in self.planned and m.samples >= self.rule.min_samples
        }
        first = {model: m for model, m in enough.items() if model not in self.adopted}
        cooling = self.replanned_at is not None and now - self.replanned_at < self.rule.cooldown_s
        drifted = self.drifted(enough)
        due = {model: r for model, r in drifted.items() if model in first or not cooling}
        if len(due) < len(drifted):
            logger.debug(
                "workload.drift_waits",
                extra={
                    "models": ",".join(m for m in drifted if m not in due),
                    "cooldown_left_s": (self.replanned_at or now) + self.rule.cooldown_s - now,
                },
            )
        adopt = enough if due and not cooling else first
        for model, m in adopt.items():
            self.planned[model] = self.adopted[model] = m.workload
        if not due:
            return None
        self.replanned_at = now
        return Replan(due, adopt)
