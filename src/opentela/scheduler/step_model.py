"""The step model: a per-step fixed cost and per-operator-class efficiencies on top of the roofline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from opentela.errors import ConfigError

OPERATOR_CLASSES = (
    "matmul",
    "lm_head",
    "attention_prefill",
    "attention_decode",
    "elementwise",
    "communication",
)
"""The classes `Operator.kind` takes; each gets its own efficiency (communication is timed on the link)."""

FITTABLE = (
    "step_overhead_s",
    "gemm",
    "gemv",
    "attention_prefill",
    "attention_decode",
    "elementwise",
    "memory",
    "head",
    "kv_traffic",
)
"""The parameters a calibration may fit."""


@dataclass(frozen=True)
class StepModel:
    """How far a (device, engine) pair falls short of the roofline, operator class by operator class.

    Efficiencies scale the compute side of an operator (peak operations per second); `memory` scales every
    operator's memory side. The identity (all 1.0, no overhead) is the pure roofline.
    """

    step_overhead_s: float = 0.0
    """Fixed cost of every forward step: scheduling, kernel launches, thread synchronisation, sampling."""
    gemm: float = 1.0
    """Share of peak reached by matrix products with many rows (prefill-shaped)."""
    gemv: float | None = None
    """Share of peak reached by matrix products with at most `gemv_rows` rows (decode-shaped); None: `gemm`."""
    gemv_rows: int = 16
    """Rows up to which a matrix product is decode-shaped; wider ones never cost less than this many rows."""
    attention_prefill: float = 1.0
    """Share of peak reached by prompt attention (causal, over new and cached tokens)."""
    attention_decode: float | None = None
    """Share of peak reached by decode attention; None: `attention_prefill`."""
    elementwise: float = 1.0
    """Share of peak reached by norms and the embedding lookup."""
    memory: float = 1.0
    """Share of the device's memory bandwidth every operator reaches."""
    head: float | None = None
    """Share of peak reached by the output projection (LM head); None: the other matrix products' rate."""
    ubatch_tokens: int = 0
    """Micro-batch of the engine (llama.cpp's n_ubatch): a step with more new tokens runs its matrix products
    as consecutive passes of at most this many rows; 0: one pass."""
    gemv_tie: float = 0.0
    """A calibration's tie: where `gemv` is not fitted, it is set to this multiple of `gemm`; 0: no tie."""
    kv_traffic: float = 1.0
    """How many times a decode step moves each byte of the KV cache it attends: 1 reads it once (paged
    attention); an engine whose cache grows by concatenation also copies it every step (read, write, then read
    by attention: about 3). Memory traffic, so it scales with a device's bandwidth, unlike an efficiency."""
    kv_pad: int = 0
    """Granularity of the KV view prompt attention runs over (llama.cpp pads it to 256 cells with flash
    attention): every query of a micro-batch attends the whole padded view, masked cells included (decode's
    one query per sequence skips them); 0: exactly the tokens it sees."""
    source: str = ""
    """Where the numbers come from (a calibration's points, a file)."""

    def __post_init__(self) -> None:
        for name in FITTABLE[1:]:  # every fittable parameter but the step overhead is a positive factor
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"step model: {name} must be positive, not {value}")
        if self.step_overhead_s < 0 or self.gemv_rows < 1:
            raise ConfigError("step model: step_overhead_s must be >= 0 and gemv_rows >= 1")
        if min(self.ubatch_tokens, self.kv_pad, self.gemv_tie) < 0:
            raise ConfigError("step model: ubatch_tokens, kv_pad and gemv_tie must be >= 0")

    @property
    def is_identity(self) -> bool:
        """Whether this is the pure roofline."""
        return replace(self, source="") == StepModel()

    def efficiency(self, kind: str) -> float:
        """The compute efficiency of an operator class (ties resolved)."""
        if kind == "matmul":
            return self.gemm
        if kind == "lm_head":
            return self.head if self.head is not None else self.gemm
        if kind == "attention_decode":
            return self.attention_decode if self.attention_decode is not None else self.attention_prefill
        if kind == "attention_prefill":
            return self.attention_prefill
        if kind == "elementwise":
            return self.elementwise
        return 1.0

    @property
    def gemv_efficiency(self) -> float:
        """The efficiency of decode-shaped matrix products (ties resolved)."""
        return self.gemv if self.gemv is not None else self.gemm

    def op_time(self, kind: str, flops: Any, nbytes: Any, rows: Any, peak: float, bandwidth: float) -> Any:
        """Roofline time of operators of class `kind` (scalars or NumPy arrays alike)."""
        t = np.maximum(flops / (peak * self.efficiency(kind)), nbytes / (bandwidth * self.memory))
        if (kind == "matmul" or (kind == "lm_head" and self.head is None)) and self.gemv is not None:
            # A skinny product runs at the gemv rate; a wider one costs at least what gemv_rows rows would,
            # which keeps the time monotone in the rows across the class boundary.
            share = np.minimum(1.0, self.gemv_rows / np.maximum(rows, 1.0))
            t = np.maximum(t, flops * share / (peak * self.gemv))
        return t

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "step model") -> StepModel:
        """Parse the mapping `to_dict` writes (unknown keys are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        try:
            values: dict[str, Any] = {}
            for key, value in raw.items():
                if key == "source":
                    values[key] = str(value)
                elif key in ("gemv_rows", "ubatch_tokens", "kv_pad"):
                    values[key] = int(value)
                else:
                    values[key] = None if value is None else float(value)
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def kv_cells(self, tokens: Any) -> Any:
        """Cells of the KV view a query attends when `tokens` are visible to it (scalars or arrays)."""
        if not self.kv_pad:
            return tokens
        return np.ceil(np.asarray(tokens, dtype=float) / self.kv_pad) * self.kv_pad

    def passes(self, tokens: int) -> list[int]:
        """Rows of each pass a step of `tokens` new tokens runs its matrix products in."""
        u = self.ubatch_tokens
        if not u or tokens <= u:
            return [tokens]
        return [u] * (tokens // u) + ([tokens % u] if tokens % u else [])

    def with_values(self, values: Mapping[str, float]) -> StepModel:
        """A copy with the fitted parameters `values` set."""
        unknown = set(values) - set(FITTABLE)
        if unknown:
            raise ConfigError(f"cannot fit {sorted(unknown)}; fittable: {', '.join(FITTABLE)}")
        changes: dict[str, Any] = dict(values)
        return replace(self, **changes)
