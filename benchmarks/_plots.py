"""Plot helpers the simulator's validation scripts share."""

from __future__ import annotations

from typing import Any


def circle_calibration_points(ax: Any, rows: list[dict], label: str | None = None) -> None:
    """Ring the points a calibration was fitted on (rows with `calibration_point`) on a measured/predicted plot."""
    cal = [r for r in rows if r["calibration_point"]]
    ax.scatter(
        [r["measured_ms"] for r in cal],
        [r["predicted_ms"] for r in cal],
        s=160,
        facecolors="none",
        edgecolors="k",
        label=label,
    )
