"""Performance profile of one model on one kind of hardware: prefill time over input length, decode iteration time
over batch size and context length, interpolated as LLM-Mesh does (its section 5.2).

Prefill time grows about linearly with the input, so it is sampled at a few lengths and interpolated linearly
between the two nearest samples. A decode iteration depends on the batch size and the average context length, so it
is sampled on a grid of both (powers of two: O(log L_max * log B_max) points, a few hundred at most) and interpolated
bilinearly between the four nearest. Outside the sampled range the nearest segment is extended, never below zero.

A profile is a small JSON file. Its id (a hash of what it measures) is what a node publishes per replica, so every
gateway and the controller can tell which profile a replica runs under. Profiles come from `otela profile` against a
live engine, or from the simulator for hardware not at hand (`source` says which).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opentela.errors import ConfigError

PROFILE_FORMAT = 1


def powers_of_two(limit: int, start: int = 1) -> tuple[int, ...]:
    """start, 2*start, 4*start, ... up to and including `limit` (added when not a power of two)."""
    out = []
    x = max(1, start)
    while x < limit:
        out.append(x)
        x *= 2
    out.append(limit)
    return tuple(out)


def _segment(xs: Sequence[float], x: float) -> tuple[int, float]:
    """The index i of the segment xs[i]..xs[i+1] to interpolate `x` in, and x's fraction along it (may be < 0 or
    > 1 outside the samples: the end segment is extended)."""
    if len(xs) == 1:
        return 0, 0.0
    i = bisect.bisect_right(xs, x) - 1
    i = min(max(i, 0), len(xs) - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class PerformanceProfile:
    """Iteration times of one model on one kind of hardware (see the module's docstring). Times in seconds."""

    model: str
    hardware: str
    """What it was measured on, e.g. "cpu:32-core Xeon 6462C" or "gpu:A100-80GB"."""
    device: str
    """"cpu" or "gpu": LLM-Mesh places on CPU instances first."""
    prefill_lengths: tuple[int, ...]
    prefill_s: tuple[float, ...]
    decode_batches: tuple[int, ...]
    decode_lengths: tuple[int, ...]
    decode_s: tuple[tuple[float, ...], ...]
    """decode_s[b][l]: one decode iteration of decode_batches[b] requests of average context decode_lengths[l]."""
    weights_bytes: int = 0
    kv_bytes_per_token: int = 0
    """C in LLM-Mesh's Eq. 2: the KV cache one token of context takes."""
    source: str = "measured"
    """"measured" (a live engine) or "simulated" (the roofline simulator)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form provenance (engine, date, settings); not part of the id."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ConfigError(f"profile device must be cpu or gpu, not {self.device!r}")
        _check_axis("prefill_lengths", self.prefill_lengths)
        _check_axis("decode_batches", self.decode_batches)
        _check_axis("decode_lengths", self.decode_lengths)
        if len(self.prefill_s) != len(self.prefill_lengths):
            raise ConfigError("profile: one prefill time per prefill length")
        if len(self.decode_s) != len(self.decode_batches) or any(
            len(row) != len(self.decode_lengths) for row in self.decode_s
        ):
            raise ConfigError("profile: decode times must be a batches x lengths grid")
        if any(t < 0 for t in self.prefill_s) or any(t < 0 for row in self.decode_s for t in row):
            raise ConfigError("profile: times cannot be negative")

    def __repr__(self) -> str:
        return f"<PerformanceProfile {self.model} on {self.hardware} ({self.source}) id={self.profile_id}>"

    def prefill_time(self, input_tokens: int) -> float:
        """Seconds to prefill `input_tokens`: linear between the two nearest sampled lengths."""
        i, f = _segment(self.prefill_lengths, input_tokens)
        if len(self.prefill_s) == 1:
            return self.prefill_s[0] * input_tokens / max(1, self.prefill_lengths[0])
        return max(0.0, self.prefill_s[i] + f * (self.prefill_s[i + 1] - self.prefill_s[i]))

    def decode_time(self, batch: int, context_tokens: float) -> float:
        """Seconds of one decode iteration of `batch` requests whose context averages `context_tokens`:
        bilinear between the four nearest grid points."""
        if batch <= 0:
            return 0.0
        bi, bf = _segment(self.decode_batches, batch)
        li, lf = _segment(self.decode_lengths, context_tokens)
        grid = self.decode_s

        def at(b: int, ll: int) -> float:
            return grid[min(b, len(grid) - 1)][min(ll, len(grid[0]) - 1)]

        low = at(bi, li) + lf * (at(bi, li + 1) - at(bi, li))
        high = at(bi + 1, li) + lf * (at(bi + 1, li + 1) - at(bi + 1, li))
        return max(0.0, low + bf * (high - low))

    @property
    def profile_id(self) -> str:
        """A short hash of what the profile measures (not its provenance)."""
        body = {k: v for k, v in self.to_dict().items() if k != "meta"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return digest[:16]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        d = asdict(self)
        d["format"] = PROFILE_FORMAT
        d["decode_s"] = [list(row) for row in self.decode_s]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerformanceProfile:
        """Read the JSON form back (ConfigError on anything malformed)."""
        if d.get("format") != PROFILE_FORMAT:
            raise ConfigError(
                f"unknown profile format {d.get('format')!r} (this version reads {PROFILE_FORMAT})"
            )
        try:
            return cls(
                model=str(d["model"]),
                hardware=str(d["hardware"]),
                device=str(d["device"]),
                prefill_lengths=tuple(int(x) for x in d["prefill_lengths"]),
                prefill_s=tuple(float(x) for x in d["prefill_s"]),
                decode_batches=tuple(int(x) for x in d["decode_batches"]),
                decode_lengths=tuple(int(x) for x in d["decode_lengths"]),
                decode_s=tuple(tuple(float(x) for x in row) for row in d["decode_s"]),
                weights_bytes=int(d.get("weights_bytes", 0)),
                kv_bytes_per_token=int(d.get("kv_bytes_per_token", 0)),
                source=str(d.get("source", "measured")),
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed profile: {exc!r}") from exc

    def save(self, path: Path) -> None:
        """Write the JSON form to `path`."""
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> PerformanceProfile:
        """Read a profile file."""
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read profile {path}: {exc}") from exc


def _check_axis(name: str, xs: Sequence[int]) -> None:
    if not xs:
        raise ConfigError(f"profile: {name} is empty")
    if any(b <= a for a, b in itertools.pairwise(xs)) or xs[0] <= 0:
        raise ConfigError(f"profile: {name} must be positive and strictly increasing, got {list(xs)}")
