"""Choosing the next token from logits: greedy, or temperature with top-k and top-p, from a seeded generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens; temperature 0 means greedy. Bad values raise ValueError on construction."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    seed: int | None = None
    """Seed for the generator a caller builds with `rng()`; None draws fresh entropy."""

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number, not {self.temperature!r}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must not be negative, not {self.temperature}")
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer, not {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, not {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        """Whether sampling reduces to argmax."""
        return self.temperature == 0.0 or self.top_k == 1

    def rng(self) -> np.random.Generator:
        """A generator seeded with `seed`."""
        return np.random.default_rng(self.seed)


GREEDY = SamplingParams(temperature=0.0)
"""Always the most likely token."""


def greedy(logits: np.ndarray) -> int:
    """The most likely token id; ties go to the lowest id."""
    row = _row(logits)
    return int(np.argmax(row))  # argmax returns the first maximum, i.e. the lowest id


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator | None = None) -> int:
    """One token id from `logits` ``[vocab]`` under `params`, drawing from `rng` (one draw per call)."""
    row = _row(logits)
    if params.is_greedy:
        return int(np.argmax(row))
    if rng is None:
        raise ValueError("sampling at a temperature above 0 needs a numpy.random.Generator")
    if not np.isfinite(row.max()):
        raise ValueError("logits have no finite maximum to sample around")
    scaled = row.astype(np.float64) / params.temperature
    # Most likely first, ties by lower id (a stable sort of the negated logits), so the result depends only
    # on the logits and the draw.
    order = np.argsort(-scaled, kind="stable")
    if params.top_k:
        order = order[: params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        # The smallest prefix whose mass reaches top_p (always at least the first token).
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1
        probs = probs[:cut] / probs[:cut].sum()
        order = order[:cut]
    cumulative = np.cumsum(probs)
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(order[min(pick, len(order) - 1)])


def _row(logits: np.ndarray) -> np.ndarray:
    row = np.asarray(logits).reshape(-1)
    if row.size == 0:
        raise ValueError("no logits to choose from")
    if np.isnan(row).any():
        raise ValueError("logits contain NaN")
    return row
