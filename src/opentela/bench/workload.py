"""What a load run sends and when: arrival times and input/output lengths, from distributions or a trace."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from opentela.bench.traces import read_trace, select_models
from opentela.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a run: when to send it (seconds from the start) and its sizes in tokens."""

    at: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LengthDistribution:
    """Token counts drawn from ``fixed:N`` (or just ``N``), ``uniform:LO:HI``, ``exp:MEAN``,
    ``normal:MEAN:SD`` or ``lognormal:MEDIAN:SIGMA``; every draw is at least 1."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> LengthDistribution:
        """Read a spec string; ConfigError names the accepted forms."""
        parts = spec.strip().split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", float(parts[0]))
            kind, nums = parts[0].lower(), [float(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(f"cannot read length spec {spec!r}") from None
        arity = {"fixed": 1, "uniform": 2, "exp": 1, "normal": 2, "lognormal": 2}
        if kind not in arity or len(nums) != arity[kind] or any(n < 0 for n in nums):
            raise ConfigError(
                f"cannot read length spec {spec!r}: use N, fixed:N, uniform:LO:HI, exp:MEAN, "
                "normal:MEAN:SD or lognormal:MEDIAN:SIGMA"
            )
        return cls(kind, *nums)

    def draw(self, rng: random.Random) -> int:
        """One token count."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "exp":
            value = rng.expovariate(1 / self.a) if self.a else 0
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.lognormvariate(math.log(max(self.a, 1e-9)), self.b)
        return max(1, round(value))


def poisson_plan(
    rate: float,
    inputs: LengthDistribution,
    outputs: LengthDistribution,
    rng: random.Random,
    *,
    duration: float | None = None,
    count: int | None = None,
) -> Iterator[PlannedRequest]:
    """Open-loop Poisson arrivals at `rate` per second, until `duration` seconds or `count` requests."""
    if rate <= 0:
        raise ConfigError("the request rate must be > 0")
    if duration is None and count is None:
        raise ConfigError("give a duration or a number of requests")
    t, n = 0.0, 0
    while (duration is None or t < duration) and (count is None or n < count):
        yield PlannedRequest(t, inputs.draw(rng), outputs.draw(rng))
        n += 1
        t += rng.expovariate(rate)


def trace_plan(
    path: str | Path,
    *,
    speedup: float = 1.0,
    count: int | None = None,
    fmt: str = "auto",
    models: Mapping[str, str] | None = None,
) -> list[PlannedRequest]:
    """Requests from a trace in any format `read_trace` reads (docs/traces.md), shifted to start at 0.

    Timestamps are divided by `speedup`; `models` keeps only the requests of the trace models it names.
    """
    if speedup <= 0:
        raise ConfigError("the trace speedup must be > 0")
    records = select_models(read_trace(path, fmt), models or {})
    if not records:
        raise ConfigError(f"trace {path} has no requests" + (" of the chosen models" if models else ""))
    start = records[0].timestamp
    # Every request asks for at least one token each way: an empty prompt or max_tokens 0 is refused upstream.
    plan = [
        PlannedRequest((r.timestamp - start) / speedup, max(1, r.input_tokens), max(1, r.output_tokens))
        for r in records
    ]
    return plan[:count] if count is not None else plan


COMMON_WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city name"
).split()
"""Words that common tokenizers keep as one token each (with their leading space)."""


def prompt_of(tokens: int, salt: int | None = None) -> str:
    """A prompt of about `tokens` tokens for common tokenizers (and for the four-characters-a-token estimate).

    Without `salt` every prompt is the same word repeated, so prompts share their prefixes (what a prefix cache
    keeps); with one, the words are drawn at random from `COMMON_WORDS` seeded by it, so two prompts share
    almost no prefix.
    """
    if salt is None:
        return "the " * tokens
    rng = random.Random(salt)
    return " ".join(rng.choices(COMMON_WORDS, k=tokens)) + " "
