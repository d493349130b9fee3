"""Calibration: fit a step model to a few measured steps, and store it per (device, engine)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device, HardwareCatalog
from opentela.scheduler.models import ModelSpec
from opentela.scheduler.roofline import Precision, step_time
from opentela.scheduler.step_model import FITTABLE, StepModel

DEFAULT_FREE = ("step_overhead_s", "gemm", "kv_traffic")
"""What three points fit on a GPU: the smallest decode step (the per-step cost: hundreds of small kernels, and
the weights read at the memory rate), the decode step holding the most context (the KV traffic of decode
attention) and the longest prefill (the matrix products' rate).

Measured on an H100 and an H200 (benchmarks/gpu_validation.py: Qwen3-1.7B and Llama-3.1-8B in bf16 on HF
transformers' SDPA path, summed kernel times, 2026-11-27; docs/benchmarks/simulator.md):
- Fitting prompt attention from a mid prefill instead (the earlier recipe) left decode steps of 16 sequences
  at 1,500 tokens 26-33 % too fast, a mean error of 10-11 % on an H100.
- Decode attention moves each cache byte 4.1-4.9 times there, on both devices and both models: that engine's
  cache grows by concatenation, so each step copies it, and grouped-query heads are expanded before attention.
  Fitted as a compute efficiency instead, the same steps fit as well on each device, but the calibration then
  transfers worse from an H100 to an H200 (speedup errors 4.7-5.4 % mean against 3.0-3.9 %), because that
  efficiency does not follow the memory bandwidth.
- Prompt attention keeps the device's value: below 2,048 tokens it is a few percent of a prefill, and moving
  it from 1.0 to 0.4 changed no figure by more than 0.5 points.
- The same recipe fits decode replayed as CUDA graphs on a static cache (a second H100 run): 4.8-7.6 % mean
  error, `kv_traffic` 11-20 there (that library masks the whole static cache, most likely losing SDPA's
  fastest kernel), and the per-step cost 1.5-1.7 ms higher (the graph's launch and the gaps between kernels)."""

CPU_FREE = ("gemm", "attention_prefill", "attention_decode")
"""What the same three points fit on a CPU: the smallest decode step (the matrix products, through the engine's
vector rows where it has them), the decode step holding the most context (decode attention, which CPU kernels
run far below their matrix rate) and the longest prefill (prompt attention, a third of its time or more)."""

LLAMA_CPP_ENGINES = frozenset({"embedded", "llama.cpp", "llamacpp", "llama-cpp", "llama-server"})
"""Engine names that run llama.cpp's kernels."""

LLAMA_CPP_CPU = StepModel(gemv_rows=3, gemv_tie=0.75, ubatch_tokens=512, kv_pad=256)
"""What llama.cpp's CPU backend fixes rather than a calibration fits.

- `gemv_rows=3`, `gemv_tie=0.75`: up to three rows, its products run row by row; from four on, in groups of
  four that cost what three single rows do. Measured on SmolLM2 (Q4_1 layers, Q8_0 output projection; 1 and 2
  threads, three runs): a decode step of two sequences costs twice one, of four three times one, and from eight
  on the cost per sequence levels off at about 3/4 of one alone. llama.cpp's tiled (tinyBLAS) and repacked
  kernels take rows in groups of four like this; its build here has them for the Q8_0 output projection but not
  for Q4_1, so which kernel gives the Q4_1 layers the same shape is not traced. These were measured on an AVX2
  host; on an AVX-512 VNNI host (2026-11-27, same build) one sequence alone runs relatively faster: two cost
  2.6 times one, four 4.2 times, sixteen 13.7 times at context 85 (at every context up to 1,521, two cost 4-7 ms
  more than twice one), so there these constants under-predict small batches. A profile of the engine there
  (perf, decode at context 64, one thread) shows why: the Q8_0 output projection takes the vector kernel for
  one row (0.7 ms a step) but tinyBLAS's 4xN tiles from two rows on, at 2.2 ms a row for two and 1.6 for four;
  and the Q4_1 layers' vector rows cost 4.2-4.4 ms a row in a batch against 3.3 ms alone (the same kernel, so
  most likely the memory access order of batched rows).
- `ubatch_tokens=512`: its default micro-batch; a longer prompt runs as passes of 512 rows.
- `kv_pad=256`: with flash attention it pads the KV view to 256 cells, and the queries of a prompt run over
  the whole view in tiles, masked cells included (a decode step's single query skips them).
"""

MAX_POINTS = 3
"""Calibration stays cheap: at most this many measured steps."""

FP16 = Precision()


@dataclass(frozen=True)
class StepPoint:
    """One measured forward step: prompt chunks (after `cached` tokens each), decoding contexts, seconds."""

    seconds: float
    prefill: tuple[int, ...] = ()
    decode: tuple[int, ...] = ()
    cached: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StepPoint:
        """Parse `{"seconds": s, "prefill": [...], "decode": [...], "cached": [...]}`."""
        try:
            return cls(
                float(raw["seconds"]),
                tuple(int(x) for x in raw.get("prefill", ())),
                tuple(int(x) for x in raw.get("decode", ())),
                tuple(int(x) for x in raw.get("cached", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"calibration point {dict(raw)!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The mapping `from_dict` reads."""
        out: dict[str, Any] = {"seconds": self.seconds}
        for name in ("prefill", "decode", "cached"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        return out


def predict(
    point: StepPoint, model: ModelSpec, device: Device, precision: Precision = FP16, tp: int = 1
) -> float:
    """The step time the device's step model predicts for `point`'s batch."""
    return step_time(model, device, point.prefill, point.decode, tp, precision, cached=point.cached)


def _levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, float]:
    # A few parameters and points: a dense Levenberg-Marquardt with a finite-difference Jacobian, each
    # parameter kept in its box; returns the parameters and the sum of squared residuals.
    x, damping = np.clip(x0.astype(float), low, high), 1e-3
    r = residuals(x)
    for _ in range(200):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            # Central differences: at a kink of the roofline's max() a one-sided difference can see a flat side
            # and never move the parameter off it.
            dx = np.zeros_like(x)
            dx[j] = 1e-4
            jac[:, j] = (residuals(x + dx) - residuals(x - dx)) / 2e-4
        grad, hess = jac.T @ r, jac.T @ jac
        step = np.linalg.solve(hess + damping * (np.diag(np.diag(hess)) + 1e-12 * np.eye(len(x))), -grad)
        candidate = np.clip(x + np.clip(step, -1.0, 1.0), low, high)
        r_new = residuals(candidate)
        if r_new @ r_new < r @ r:
            done = float(np.max(np.abs(candidate - x))) < 1e-9
            x, r, damping = candidate, r_new, max(damping / 3, 1e-9)
            if done:
                break
        else:
            damping *= 4
            if damping > 1e9:
                break
    return x, float(r @ r)


def fit_step_model(
    points: Sequence[StepPoint],
    model: ModelSpec,
    device: Device,
    precision: Precision = FP16,
    tp: int = 1,
    free: Sequence[str] = DEFAULT_FREE,
    base: StepModel | None = None,
) -> StepModel:
    """The step model that best matches `points` (relative error, least squares), fitting only `free`.

    Parameters not in `free` keep `base`'s values (the device's current step model by default); the fit
    uses at most `MAX_POINTS` points and never more parameters than points.
    """
    if not 1 <= len(points) <= MAX_POINTS:
        raise ConfigError(f"calibrate on 1 to {MAX_POINTS} points, not {len(points)}")
    unknown = set(free) - set(FITTABLE)
    if unknown or not free or len(free) > len(points):
        raise ConfigError(
            f"fit 1 to {len(points)} of {', '.join(FITTABLE)} on {len(points)} points, not {list(free)}"
        )
    start = base if base is not None else device.step
    measured = np.array([p.seconds for p in points])
    if np.any(measured <= 0):
        raise ConfigError("measured step times must be positive")

    def model_at(x: np.ndarray) -> StepModel:
        # Log space keeps the factors positive; the overhead is fitted in milliseconds, log(ms + 1e-6).
        values = {
            name: (math.exp(v) - 1e-6) / 1e3 if name == "step_overhead_s" else math.exp(v)
            for name, v in zip(free, x, strict=True)
        }
        values["step_overhead_s"] = max(values.get("step_overhead_s", start.step_overhead_s), 0.0)
        if start.gemv_tie and "gemv" not in free:
            values["gemv"] = start.gemv_tie * values.get("gemm", start.gemm)
        return start.with_values(values)

    def residuals(x: np.ndarray) -> np.ndarray:
        dev = device.with_step(model_at(x))
        predicted = np.array([predict(p, model, dev, precision, tp) for p in points])
        return np.log(predicted / measured)

    # Efficiencies within (1e-4, 2] of the catalog's peak; the overhead within (0, 10 s]; the KV traffic
    # within [0.5, 50] reads of the cache.
    bounds = {"step_overhead_s": (1e-6, 1e4), "kv_traffic": (0.5, 50.0)}
    low = np.log([bounds.get(name, (1e-4, 2.0))[0] for name in free])
    high = np.log([bounds.get(name, (1e-4, 2.0))[1] for name in free])
    best: tuple[np.ndarray, float] | None = None
    # The roofline's max() leaves flat regions (a class that turns memory-bound stops answering to its
    # efficiency): start from a few places and keep the best fit.
    # Distinct starting efficiencies per parameter: where two classes tie inside a max(), a forward difference
    # sees no change in either and the fit would never separate them.
    spread = -np.log(0.7) * np.arange(len(free))

    def first_guess(eff: float, ms: float) -> np.ndarray:
        values = [
            math.log(ms)
            if name == "step_overhead_s"
            else math.log(2.0)
            if name == "kv_traffic"
            else math.log(eff) + spread[i]
            for i, name in enumerate(free)
        ]
        return np.array(values)

    starts = [first_guess(eff, ms) for eff, ms in ((0.5, 1.0), (0.1, 0.1), (0.9, 5.0), (0.02, 0.5))]
    # Then a coarse grid: an operator class that only binds far below the others' rate (decode attention
    # over a cache an engine copies every step, say) sits on a flat side of the max() from the starts above.
    grid = {"step_overhead_s": (0.3, 3.0), "kv_traffic": (1.0, 4.0)}
    for combo in itertools.product(*[grid.get(name, (0.5, 0.05, 0.005)) for name in free]):
        starts.append(np.log(np.array(combo, dtype=float)))
    for guess in starts:
        found = _levenberg_marquardt(residuals, guess, low, high)
        if best is None or found[1] < best[1]:
            best = found
        if best[1] < 1e-12:
            break
    assert best is not None
    fitted = model_at(best[0])
    return replace(fitted, source="fitted on " + ", ".join(_describe(p) for p in points))


def _describe(p: StepPoint) -> str:
    parts = []
    if p.prefill:
        parts.append(f"prefill {'+'.join(map(str, p.prefill))}")
    if p.decode:
        parts.append(f"decode {len(p.decode)}x{int(np.mean(p.decode))}")
    return " ".join(parts) + f" = {p.seconds * 1e3:.1f} ms"


def profile_points(profile: PerformanceProfile) -> list[StepPoint]:
    """Every step a performance profile (`otela profile`) measured: prefills (time to first token, one step
    each) and decode iterations (batch x average context)."""
    points = [
        StepPoint(t, prefill=(n,)) for n, t in zip(profile.prefill_lengths, profile.prefill_s, strict=True)
    ]
    for batch, row in zip(profile.decode_batches, profile.decode_s, strict=True):
        for length, t in zip(profile.decode_lengths, row, strict=True):
            if math.isfinite(t) and t > 0:
                points.append(StepPoint(t, decode=(length,) * batch))
    return [p for p in points if math.isfinite(p.seconds) and p.seconds > 0]


def recipe(kind: str, engine: str) -> tuple[tuple[str, ...], StepModel | None]:
    """What a calibration of `engine` on a device of `kind` (cpu or gpu) fits, and the step model it starts
    from (None: the device's own)."""
    if kind != "cpu":
        return DEFAULT_FREE, None
    return CPU_FREE, LLAMA_CPP_CPU if engine.lower() in LLAMA_CPP_ENGINES else None


def choose_points(points: Sequence[StepPoint]) -> list[StepPoint]:
    """The three calibration points `recipe` fits, on a GPU as on a CPU: the smallest decode step, the decode
    step holding the most context in total, and the longest prefill."""
    decodes = [p for p in points if p.decode and not p.prefill]
    prefills = [p for p in points if p.prefill and not p.decode and not any(p.cached)]
    if len(decodes) < 2 or not prefills:
        raise ConfigError("calibration needs two decode steps (short and long context) and a prefill")
    small = min(decodes, key=lambda p: (len(p.decode), sum(p.decode)))
    most = max((p for p in decodes if p is not small), key=lambda p: (sum(p.decode), len(p.decode)))
    return [small, most, max(prefills, key=lambda p: sum(p.prefill))]


PREFILL_GRID = (16, 32, 64, 128, 256, 512, 1024, 1536, 2048)
"""Prompt lengths of the validation grid."""
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_CONTEXTS = (64, 512, 1500)
"""Decode batches and per-sequence contexts of the validation grid."""


def validation_grid(
    prefill: Sequence[int] = PREFILL_GRID,
    batches: Sequence[int] = DECODE_BATCHES,
    contexts: Sequence[int] = DECODE_CONTEXTS,
) -> list[StepPoint]:
    """The steps to measure (seconds 0.0, to be filled in): every prompt length, every batch x context."""
    points = [StepPoint(0.0, prefill=(n,)) for n in prefill]
    points += [StepPoint(0.0, decode=(c,) * b) for c in contexts for b in batches]
    return points


def shape(point: StepPoint) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A point's batch without its time: what to match calibration points by."""
    return point.prefill, point.decode, point.cached


def kind_of(point: StepPoint) -> str:
    """prefill, cached_prefill (after a prefix hit), decode or mixed."""
    if point.prefill and point.decode:
        return "mixed"
    if point.prefill:
        return "cached_prefill" if any(point.cached) else "prefill"
    return "decode"


def error_summary(
    measured: Sequence[StepPoint], predicted: Sequence[float], calibration: Sequence[StepPoint] = ()
) -> dict[str, dict[str, float]]:
    """Mean and worst absolute relative error (percent) per kind of step and overall, leaving out the
    calibration points."""
    skip = {shape(p) for p in calibration}
    by_kind: dict[str, list[float]] = {}
    for point, guess in zip(measured, predicted, strict=True):
        if shape(point) in skip:
            continue
        error = abs(guess / point.seconds - 1) * 100
        by_kind.setdefault(kind_of(point), []).append(error)
        by_kind.setdefault("all", []).append(error)
    return {
        kind: {
            "points": float(len(errors)),
            "mean_abs_pct": round(float(np.mean(errors)), 2),
            "max_abs_pct": round(float(np.max(errors)), 2),
        }
        for kind, errors in by_kind.items()
    }


def default_store() -> Path:
    """Where calibrations live unless told otherwise: $OTELA_STEP_MODELS, else ~/.config/opentela/step-models."""
    explicit = os.environ.get("OTELA_STEP_MODELS")
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "opentela" / "step-models"


def _file_name(device: str, engine: str) -> str:
    safe = [re.sub(r"[^A-Za-z0-9_.-]+", "_", x.lower()) for x in (device, engine)]
    return f"{safe[0]}--{safe[1]}.json"


@dataclass(frozen=True)
class Calibration:
    """A fitted step model with what it was fitted on: one JSON file per (device, engine)."""

    device: str
    engine: str
    step: StepModel
    model: str = ""
    points: tuple[StepPoint, ...] = field(default=())

    def save(self, directory: Path) -> Path:
        """Write `<device>--<engine>.json` under `directory`; returns the path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / _file_name(self.device, self.engine)
        doc = {
            "device": self.device,
            "engine": self.engine,
            "model": self.model,
            "step_model": self.step.to_dict(),
            "points": [p.to_dict() for p in self.points],
        }
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read a file `save` wrote."""
        try:
            doc = json.loads(path.read_text())
            return cls(
                str(doc["device"]),
                str(doc["engine"]),
                StepModel.from_dict(doc["step_model"], str(path)),
                str(doc.get("model", "")),
                tuple(StepPoint.from_dict(p) for p in doc.get("points", ())),
            )
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read calibration {path}: {exc}") from None


def find_calibration(directory: Path, device: str, engine: str) -> Calibration | None:
    """The stored calibration of (device, engine), or None."""
    path = directory / _file_name(device, engine)
    return Calibration.load(path) if path.is_file() else None


def calibrated_catalog(catalog: HardwareCatalog, engine: str, directory: Path) -> HardwareCatalog:
    """`catalog` with every device that has a stored calibration for `engine` carrying its step model."""
    devices = {}
    for name in catalog:
        found = find_calibration(directory, name, engine)
        device = catalog[name]
        devices[name] = device.with_step(found.step) if found else device
    return HardwareCatalog(devices)
