"""The numbers of a load run: per-request outcomes in, percentiles, throughput and errors out."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 95, 99)


@dataclass(slots=True)
class Outcome:
    """One finished request as the client saw it (times in seconds from the run's start)."""

    sent_at: float
    ok: bool
    status: int = 0
    error: str = ""
    ttft: float | None = None
    e2e: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    node: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary_ms(values: list[float]) -> dict[str, float] | None:
    """Mean and percentiles of seconds, in milliseconds."""
    if not values:
        return None
    out = {"mean": round(sum(values) / len(values) * 1000, 3)}
    for q in PERCENTILES:
        out[f"p{q}"] = round(percentile(values, q) * 1000, 3)
    return out


def build_report(outcomes: list[Outcome], elapsed: float, settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON report: settings, counts, errors by kind, latency percentiles, throughput, a timeline."""
    done = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    out_tokens = sum(o.output_tokens for o in done)
    in_tokens = sum(o.input_tokens for o in done)
    timeline: dict[int, dict[str, int]] = {}
    for o in outcomes:
        end = o.sent_at + (o.e2e or 0.0)
        slot = timeline.setdefault(int(end), {"completed": 0, "errors": 0, "output_tokens": 0})
        if o.ok:
            slot["completed"] += 1
            slot["output_tokens"] += o.output_tokens
        else:
            slot["errors"] += 1
    return {
        "settings": settings,
        "requests": len(outcomes),
        "completed": len(done),
        "failed": len(failed),
        "errors": dict(Counter(o.error or str(o.status) for o in failed)),
        "duration_s": round(elapsed, 3),
        "throughput": {
            "requests_per_s": round(len(done) / elapsed, 3) if elapsed else 0.0,
            "output_tokens_per_s": round(out_tokens / elapsed, 1) if elapsed else 0.0,
            "input_tokens_per_s": round(in_tokens / elapsed, 1) if elapsed else 0.0,
        },
        "ttft_ms": summary_ms([o.ttft for o in done if o.ttft is not None]),
        "tpot_ms": summary_ms([t for o in done if (t := o.tpot) is not None]),
        "itl_ms": summary_ms([x for o in done for x in o.itls]),
        "e2e_ms": summary_ms([o.e2e for o in done if o.e2e is not None]),
        "timeline": [{"second": s, **timeline[s]} for s in sorted(timeline)],
    }
