"""A synthetic stand-in for LLM-Mesh's workload: Azure Functions invocations mapped to models, Azure LLM lengths.

The paper maps each model to a function of the Azure Functions trace (Shahrad et al., "Serverless in the Wild",
USENIX ATC 2020) and samples prompt and output lengths from the Azure LLM inference conversation trace (Patel et
al., "Splitwise", ISCA 2024). Neither data set can be fetched here, so this module draws a trace with their
published statistics instead; everything it makes is a synthetic stand-in, not the traces themselves.

- Skew of invocation rates across functions: Shahrad et al. report an 8-order-of-magnitude range, 45 % of
  applications invoked at most once an hour on average and 81 % at most once a minute. A log-normal over the
  per-day rate through those two quantiles has a median of about 40 invocations a day and a spread of 1.77 decades
  (so +-2.3 sigma spans the 8 orders). The paper samples functions active in its 30-minute window and serves
  private models with infrequent requests, so rates are taken from that log-normal between once an hour and once
  a second (uncapped, the single most popular of 32-128 functions drawn carries 30-90 % of all requests, and the
  load of a run becomes a lottery). The n functions sit at evenly spaced quantiles of that range (a stratified
  sample: the same skew in every run), scaled by one factor (`rate_scale`) that sets the cluster's load, as the
  paper does not print its request rates.
- Burstiness: most frequently invoked functions in that trace arrive far less regularly than a Poisson process.
  Each function here is a renewal process with gamma-distributed gaps whose coefficient of variation is 2 (an
  assumption: the characterisation gives a distribution of CVs, not one figure).
- Lengths: the conversation trace (Splitwise, 2023) has a median prompt of 1020 tokens and a mean of about 1155, a
  median output of 129 tokens and a mean of about 211. Log-normals through each median and mean give sigma 0.50
  (prompt) and 0.99 (output); a request is clipped to the models' 4096-token window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from opentela.scheduler.workload import Trace

SECONDS_PER_DAY = 86_400.0


def _lognormal_sigma(median: float, mean: float) -> float:
    # For a log-normal, mean / median = exp(sigma^2 / 2).
    return math.sqrt(2.0 * math.log(mean / median))


@dataclass(frozen=True)
class AzureStandIn:
    """Parameters of the synthetic stand-in (see the module's docstring for what each is fitted to)."""

    rate_log10_median_per_day: float = 1.603
    """Median of log10(invocations per day) across functions (through Shahrad et al.'s 45 % / 81 % quantiles)."""
    rate_log10_sigma: float = 1.772
    """Spread of log10(invocations per day) across functions, in decades."""
    min_rate_per_day: float = 24.0
    """Functions taken are invoked at least once an hour (active in a 30-minute window)."""
    max_rate_per_day: float = SECONDS_PER_DAY
    """... and at most once a second on average (infrequently invoked private models)."""
    rate_scale: float = 1.0
    """Multiplies every function's rate: the one knob for the cluster's load."""
    interarrival_cv: float = 2.0
    """Coefficient of variation of one function's inter-arrival gaps (gamma renewal process)."""
    input_median: float = 1020.0
    input_mean: float = 1155.0
    output_median: float = 129.0
    output_mean: float = 211.0
    max_context: int = 4096

    @property
    def mean_output(self) -> float:
        """Ō of LLM-Mesh's Eq. 2: the average output length the memory subsystem assumes."""
        return self.output_mean

    def function_rates(self, n_models: int) -> np.ndarray:
        """Invocations per second of `n_models` functions at evenly spaced quantiles of the fitted log-normal
        between the minimum and maximum rate, highest first, times `rate_scale`."""
        dist = NormalDist(self.rate_log10_median_per_day, self.rate_log10_sigma)
        low, high = dist.cdf(math.log10(self.min_rate_per_day)), dist.cdf(math.log10(self.max_rate_per_day))
        quantiles = low + (high - low) * (np.arange(n_models) + 0.5) / n_models
        per_day = np.array([10 ** dist.inv_cdf(float(q)) for q in quantiles[::-1]])
        return per_day / SECONDS_PER_DAY * self.rate_scale

    def lengths(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output lengths of `n` requests (log-normals through the published medians and means)."""
        inp = rng.lognormal(
            math.log(self.input_median), _lognormal_sigma(self.input_median, self.input_mean), n
        )
        out = rng.lognormal(
            math.log(self.output_median), _lognormal_sigma(self.output_median, self.output_mean), n
        )
        out_i = np.clip(np.rint(out), 1, self.max_context // 2).astype(np.int64)
        inp_i = np.clip(np.rint(inp), 1, self.max_context - out_i).astype(np.int64)
        return inp_i, out_i

    def arrivals(self, rate: float, duration: float, rng: np.random.Generator) -> np.ndarray:
        """Arrival times of one function over `duration` seconds: gamma gaps of mean 1 / rate and the set CV,
        the first gap drawn from the same law shifted by a uniform phase so runs do not all start with a request."""
        if rate <= 0:
            return np.zeros(0)
        shape = 1.0 / self.interarrival_cv**2
        scale = 1.0 / (rate * shape)
        n = int(rate * duration * 1.5) + 16
        gaps = rng.gamma(shape, scale, n)
        times = np.cumsum(gaps) - rng.uniform(0, gaps[0])
        while times[-1] < duration:
            more = np.cumsum(rng.gamma(shape, scale, n)) + times[-1]
            times = np.concatenate([times, more])
        return times[(times >= 0) & (times < duration)]

    def trace(self, n_models: int, duration: float, rng: np.random.Generator) -> Trace:
        """A seeded trace: `n_models` functions (model index = rank by rate) over `duration` seconds."""
        rates = self.function_rates(n_models)
        times = [self.arrivals(float(r), duration, rng) for r in rates]
        arrival = np.concatenate(times) if times else np.zeros(0)
        model = np.concatenate([np.full(len(t), i, dtype=np.int64) for i, t in enumerate(times)])
        order = np.argsort(arrival, kind="stable")
        inp, out = self.lengths(len(arrival), rng)
        return Trace(arrival[order], inp, out, model[order])


def interarrival_cv(arrival: np.ndarray) -> float:
    """Coefficient of variation of the gaps between sorted arrival times (NaN with fewer than 3 arrivals)."""
    if len(arrival) < 3:
        return float("nan")
    gaps = np.diff(np.sort(arrival))
    return float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else float("nan")
