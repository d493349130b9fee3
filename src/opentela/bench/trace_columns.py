"""A trace as one NumPy array per field, and the helpers every trace statistic shares (percentiles, CDFs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from opentela.bench.traces import TraceRecord

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class TraceColumns:
    """A trace as one array per field, so that each statistic is a few vectorised passes."""

    models: tuple[str, ...]
    """Model names; `model` holds indexes into this tuple."""
    model: npt.NDArray[np.int32]
    timestamp: Floats
    input_tokens: Ints
    output_tokens: Ints
    e2e_s: Floats
    """NaN where unknown."""
    reasoning: npt.NDArray[np.int8]
    """1 reasoning, 0 not, -1 unknown."""
    prefix_hashes: Sequence[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.timestamp)

    def __repr__(self) -> str:
        return f"TraceColumns({len(self)} requests, {len(self.models)} models)"

    def code(self, model: str) -> int:
        """The index of `model`, or a ValueError naming the models the trace has."""
        try:
            return self.models.index(model)
        except ValueError:
            known = ", ".join(sorted(self.models)[:20])
            raise ValueError(f"model {model!r} is not in the trace (it has: {known})") from None

    @property
    def tokens(self) -> Ints:
        """Input plus output tokens per request."""
        return self.input_tokens + self.output_tokens


TraceData = Sequence[TraceRecord] | TraceColumns


def columns(trace: TraceData) -> TraceColumns:
    """The trace as arrays (returned as is when it already is)."""
    if isinstance(trace, TraceColumns):
        return trace
    n = len(trace)
    codes: dict[str, int] = {}
    # setdefault's second argument is evaluated first, so a new model gets the next free code.
    model = np.fromiter((codes.setdefault(r.model, len(codes)) for r in trace), np.int32, n)
    return TraceColumns(
        models=tuple(codes),
        model=model,
        timestamp=np.fromiter((r.timestamp for r in trace), np.float64, n),
        input_tokens=np.fromiter((r.input_tokens for r in trace), np.int64, n),
        output_tokens=np.fromiter((r.output_tokens for r in trace), np.int64, n),
        e2e_s=np.fromiter((math.nan if r.e2e_s is None else r.e2e_s for r in trace), np.float64, n),
        reasoning=np.fromiter((-1 if r.reasoning is None else int(r.reasoning) for r in trace), np.int8, n),
        prefix_hashes=[r.prefix_hashes for r in trace],
    )


def percentiles(values: npt.ArrayLike, qs: Sequence[float] = (50, 95, 99)) -> tuple[float, ...]:
    """Nearest-rank percentiles of `values` (NaN for an empty set)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return tuple(math.nan for _ in qs)
    return tuple(float(v) for v in np.percentile(arr, list(qs), method="inverted_cdf"))


def ecdf(values: npt.ArrayLike, max_points: int = 2000) -> tuple[Floats, Floats]:
    """The empirical CDF as (x, F(x)), thinned to at most `max_points` steps for plotting."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    f = np.arange(1, x.size + 1, dtype=np.float64) / max(x.size, 1)
    if x.size > max_points:
        keep = np.unique(np.linspace(0, x.size - 1, max_points).astype(np.int64))
        x, f = x[keep], f[keep]
    return x, f


def by_model(cols: TraceColumns) -> list[npt.NDArray[np.int64]]:
    """The request indexes of each model code, in trace order."""
    order = np.argsort(cols.model, kind="stable")
    bounds = np.cumsum(np.bincount(cols.model, minlength=len(cols.models)))
    return np.split(order, bounds[:-1])
