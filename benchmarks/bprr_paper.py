"""The numbers Sun et al. publish for Tables 4-6 and C.7-C.10, as (experiment, MATLAB simulator) pairs.

Columns everywhere: (0.1 req/s, l_max 64), (0.1, 128), (0.5, 64), (0.5, 128); times in seconds.
"""

from __future__ import annotations

COLUMNS = ((0.1, 64), (0.1, 128), (0.5, 64), (0.5, 128))

Pair = tuple[float, float]
Row = tuple[Pair, Pair, Pair, Pair]


def _row(*values: float) -> Row:
    """Eight numbers (exp, matlab) x 4 columns as four pairs."""
    pairs = [(values[i], values[i + 1]) for i in range(0, 8, 2)]
    return (pairs[0], pairs[1], pairs[2], pairs[3])


PER_TOKEN: dict[str, dict[str, Row]] = {
    "Cluster0": {
        "petals": _row(6.23, 5.33, 4.76, 4.74, 6.28, 5.33, 5.14, 4.74),
        "proposed": _row(1.92, 1.59, 1.43, 0.92, 2.00, 1.59, 1.34, 0.92),
    },
    "Cluster1": {
        "petals": _row(5.44, 5.17, 4.60, 4.58, 5.56, 5.17, 4.79, 4.58),
        "proposed": _row(1.78, 1.65, 1.04, 0.83, 1.88, 1.65, 1.11, 0.83),
    },
    "Cluster2": {
        "petals": _row(5.30, 4.85, 4.85, 4.07, 5.34, 4.85, 5.25, 4.07),
        "proposed": _row(1.79, 1.59, 1.31, 0.92, 1.94, 1.59, 1.37, 0.92),
    },
    "AboveNet": {
        "petals": _row(4.98, 4.75, 4.03, 3.88, 5.26, 5.11, 4.58, 4.10),
        "proposed": _row(1.86, 1.63, 1.44, 1.36, 1.97, 1.83, 1.35, 1.05),
    },
    "BellCanada": {
        "petals": _row(6.31, 6.03, 3.82, 3.49, 6.74, 6.19, 4.16, 3.41),
        "proposed": _row(1.33, 1.41, 1.26, 0.92, 1.49, 1.41, 1.11, 0.92),
    },
    "GTS-CE": {
        "petals": _row(7.05, 6.12, 4.69, 3.47, 6.89, 5.97, 4.89, 3.37),
        "proposed": _row(1.38, 1.41, 0.95, 0.91, 1.35, 1.40, 1.07, 0.91),
    },
}
"""Tables 4 (clustered) and 5 (scattered): average per-token time over all tokens."""

FIRST_TOKEN: dict[str, dict[str, Row]] = {
    "Cluster0": {
        "petals": _row(275.51, 252.61, 455.61, 427.72, 315.53, 252.61, 508.52, 427.72),
        "proposed": _row(60.43, 73.51, 62.98, 60.91, 66.94, 73.51, 69.62, 60.91),
    },
    "Cluster1": {
        "petals": _row(236.34, 252.51, 463.39, 424.94, 298.27, 252.51, 489.85, 424.06),
        "proposed": _row(55.47, 85.50, 59.67, 72.06, 57.37, 85.50, 65.96, 72.06),
    },
    "Cluster2": {
        "petals": _row(245.70, 251.95, 470.33, 404.42, 259.69, 251.95, 480.43, 404.42),
        "proposed": _row(50.96, 73.51, 55.72, 60.91, 55.36, 73.51, 59.86, 60.91),
    },
    "AboveNet": {
        "petals": _row(270.96, 254.74, 408.59, 316.21, 279.38, 264.81, 486.68, 412.72),
        "proposed": _row(76.48, 73.69, 89.15, 104.19, 81.65, 81.12, 91.41, 75.78),
    },
    "BellCanada": {
        "petals": _row(360.94, 353.12, 382.01, 354.06, 378.10, 353.46, 417.17, 353.72),
        "proposed": _row(53.42, 62.75, 59.73, 62.68, 63.78, 62.67, 66.84, 62.70),
    },
    "GTS-CE": {
        "petals": _row(393.93, 353.48, 478.71, 354.05, 389.35, 353.46, 505.90, 353.79),
        "proposed": _row(55.30, 62.84, 58.59, 62.66, 58.17, 62.65, 61.22, 62.65),
    },
}
"""Tables C.7 and C.9: time to the first token."""

REMAINING_TOKEN: dict[str, dict[str, Row]] = {
    "Cluster0": {
        "petals": _row(1.96, 1.40, 1.21, 1.41, 1.37, 1.40, 1.18, 1.41),
        "proposed": _row(0.99, 0.45, 0.94, 0.45, 0.96, 0.45, 0.81, 0.45),
    },
    "Cluster1": {
        "petals": _row(1.78, 1.25, 0.99, 1.27, 0.91, 1.25, 0.97, 1.27),
        "proposed": _row(0.93, 0.32, 0.58, 0.26, 0.98, 0.32, 0.60, 0.26),
    },
    "Cluster2": {
        "petals": _row(1.49, 0.93, 1.18, 0.91, 1.29, 0.93, 1.51, 0.91),
        "proposed": _row(1.01, 0.45, 0.88, 0.45, 1.09, 0.45, 0.91, 0.45),
    },
    "AboveNet": {
        "petals": _row(0.77, 0.79, 0.84, 0.92, 0.91, 0.98, 0.78, 0.88),
        "proposed": _row(0.67, 0.52, 0.75, 0.55, 0.70, 0.57, 0.64, 0.46),
    },
    "BellCanada": {
        "petals": _row(0.69, 0.53, 0.84, 0.73, 0.80, 0.68, 0.91, 0.66),
        "proposed": _row(0.50, 0.44, 0.79, 0.44, 0.51, 0.44, 0.59, 0.44),
    },
    "GTS-CE": {
        "petals": _row(0.92, 0.61, 0.96, 0.71, 0.83, 0.44, 0.95, 0.67),
        "proposed": _row(0.52, 0.43, 0.50, 0.42, 0.49, 0.42, 0.59, 0.43),
    },
}
"""Tables C.8 and C.10: time of each token after the first."""

RUNNING_TIME: dict[str, dict[str, tuple[float, float]]] = {
    "Clustered": {"petals": (0.0186, 0.0013), "proposed": (0.0216, 0.0004)},
    "AboveNet": {"petals": (0.0190, 0.0081), "proposed": (0.0333, 0.0128)},
    "BellCanada": {"petals": (0.0291, 0.0011), "proposed": (0.0287, 0.0018)},
    "GTS-CE": {"petals": (0.0350, 0.0020), "proposed": (0.0320, 0.0012)},
}
"""Table 6: algorithm running time, mean and std (seconds, MATLAB)."""
