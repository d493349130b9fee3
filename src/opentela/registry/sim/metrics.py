"""Summaries of a simulated run: percentiles, traffic per node, connections, and growth laws fitted against N."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank, as `benchmarks/convergence.py` computes it."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def spread(values: Sequence[float], digits: int = 4) -> dict[str, float]:
    """p50, p95, slowest and the count that never arrived (inf)."""
    finite = [v for v in values if v != math.inf]
    missing = len(values) - len(finite)
    if not values:
        return {"replicas": 0, "p50_s": math.nan, "p95_s": math.nan, "slowest_s": math.nan, "missing": 0}
    return {
        "replicas": len(values),
        "p50_s": round(percentile(values, 0.50), digits),
        "p75_s": round(percentile(values, 0.75), digits),
        "p95_s": round(percentile(values, 0.95), digits),
        "slowest_s": round(max(values), digits) if not missing else math.inf,
        "missing": missing,
    }


def per_node(values: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p99 and max over nodes."""
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "mean": round(float(np.mean(values)), 1),
        "p50": round(percentile(values, 0.5), 1),
        "p99": round(percentile(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def fit_growth(ns: Sequence[float], ys: Sequence[float]) -> dict[str, object]:
    """Fit y = a * N^b and y = a + b * ln N; keep the one with the smaller relative error.

    Relative error (residuals over y) so that a fit is judged as much at 128 nodes as at 10,000.
    """
    n = np.asarray(ns, dtype=float)
    y = np.asarray(ys, dtype=float)
    ok = np.isfinite(y) & (y > 0)
    n, y = n[ok], y[ok]
    if len(n) < 2:
        return {"law": "n/a"}
    b, log_a = np.polyfit(np.log(n), np.log(y), 1)
    power = np.exp(log_a) * n**b
    lb, la = np.polyfit(np.log(n), y, 1)
    logarithmic = la + lb * np.log(n)
    err_power = float(np.sqrt(np.mean(((power - y) / y) ** 2)))
    err_log = float(np.sqrt(np.mean(((logarithmic - y) / y) ** 2)))
    if err_power <= err_log:
        return {
            "law": "power",
            "a": float(np.exp(log_a)),
            "b": float(b),
            "text": f"{np.exp(log_a):.3g} * N^{b:.2f}",
            "rel_error": round(err_power, 3),
        }
    return {
        "law": "log",
        "a": float(la),
        "b": float(lb),
        "text": f"{la:.3g} + {lb:.3g} * ln N",
        "rel_error": round(err_log, 3),
    }
