"""A synthetic trace with the published shape of the Swiss AI trace (paper section 6.2, Figures 9-15).

Nothing here comes from the real trace: every number is a parameter, set from the figures and numbers the paper
prints (docs/benchmarks/traces.md has the table of which parameter was fitted to which published number), so
`trace_analysis` can be checked against known truth. All randomness comes from one `numpy.random.Generator`
seeded by `seed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from opentela.bench.traces import PREFIX_BLOCK_TOKENS, TraceRecord

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

_Z = NormalDist()
_Z95 = _Z.inv_cdf(0.95)
MINUTES_PER_DAY = 1440


@dataclass(frozen=True)
class ModelSpec:
    """One synthetic model: its share of tokens, its request shape and how its requests arrive."""

    name: str
    token_share: float
    """Target share of all the trace's input + output tokens (Fig. 9)."""
    reasoning: bool = False
    """Reasoning requests draw their outputs from the reasoning distribution (Fig. 15)."""
    input_median: float = 350.0
    """Median first-turn prompt in tokens (Fig. 12: most prompts are 10^2-10^3 tokens)."""
    input_sigma: float = 0.9
    """Log-space spread of the prompt length."""
    long_prompt_share: float = 0.0
    """Requests whose prompt is a long, fixed-length one (Fig. 12's DeepSeek distill: a jump near 10^4)."""
    long_prompt_tokens: int = 9_800
    short_output_share: float = 0.0
    """Non-reasoning requests answered with 1-2 tokens (Fig. 12's classifier and guardrail traffic)."""
    output_drift_sigma: float = 0.0
    """Day-to-day spread of the log output length, an AR(1) walk over days (Fig. 13's fluctuating ratio)."""
    prefix_reuse: float = 0.0
    """Target share of input tokens reused from the session's previous turn (Fig. 14). Sessions have a geometric
    number of turns with mean 1 / (1 - prefix_reuse), which gives that share in expectation."""
    history_keep: float = 1.0
    """Share of a turn's output carried into the next prompt (reasoning text is dropped from the history)."""
    burst_share: float = 0.3
    """Requests (or sessions) that arrive in bursts rather than in the diurnal background (Figs. 10-11)."""
    burst_rpm: float = 40.0
    """Requests per minute while a burst lasts."""
    burst_minutes: float = 2.0
    """Mean length of a burst (exponential)."""
    start_frac: float = 0.0
    """When in the trace's span the model is first served (its lifecycle begins)."""
    tpot_s: float = 0.03
    """Seconds per output token before the latency fit (relative speed of models within a class)."""

    def __post_init__(self) -> None:
        shares = (self.long_prompt_share, self.short_output_share, self.burst_share, self.history_keep)
        if self.token_share <= 0 or not all(0 <= s <= 1 for s in shares):
            raise ValueError(f"{self.name}: token_share must be positive and the other shares within [0, 1]")
        if not (0 <= self.prefix_reuse < 1 and 0 <= self.start_frac < 1):
            raise ValueError(f"{self.name}: prefix_reuse and start_frac must be within [0, 1)")
        if min(self.input_median, self.input_sigma, self.burst_rpm, self.burst_minutes, self.tpot_s) <= 0:
            raise ValueError(f"{self.name}: lengths, spreads, rates and times must be positive")


@dataclass(frozen=True)
class SyntheticParams:
    """The trace-wide targets, the paper's numbers by default (section 6.2, Fig. 15)."""

    non_reasoning_output_p50: float = 87.0
    non_reasoning_output_p95: float = 828.0
    reasoning_output_p50: float = 1_782.0
    reasoning_output_p95: float = 7_628.0
    reasoning_e2e_p95_s: float = 173.58
    non_reasoning_e2e_p95_s: float = 30.77
    user_turn_median: float = 120.0
    """Median tokens a user adds in a later turn of a session."""
    user_turn_sigma: float = 0.8
    think_time_s: float = 60.0
    """Mean time between a response and the session's next turn (well inside the 1 h reuse window)."""
    max_input_tokens: int = 131_072
    max_output_tokens: int = 32_768
    start_unix: float = 1_719_792_000.0
    """2024-07-01 00:00 UTC, a Monday: the real trace's first month."""


def _tail(names: tuple[str, ...], total: float, exponent: float) -> tuple[tuple[str, float], ...]:
    weights = [(i + 1) ** -exponent for i in range(len(names))]
    return tuple((n, total * w / sum(weights)) for n, w in zip(names, weights, strict=True))


TAIL_SHARE = 0.03
"""The long tail's share of tokens, spread over its models as rank^-0.5."""
_TAIL = _tail(
    (
        "Llama-3.1-8B-Instruct",
        "Mistral-Small-3.1-24B-Instruct",
        "QwQ-32B",
        "Qwen2.5-Coder-32B-Instruct",
        "phi-4",
        "Llama-3.2-3B-Instruct",
        "Mixtral-8x22B-Instruct",
        "gpt-oss-120b",
        "Llama-4-Scout-17B-16E-Instruct",
        "Qwen2.5-7B-Instruct",
        "OLMo-2-1124-13B-Instruct",
        "SmolLM2-1.7B-Instruct",
    ),
    TAIL_SHARE,
    0.5,
)
_TAIL_REASONING = {"QwQ-32B", "gpt-oss-120b"}

DEFAULT_MODELS: tuple[ModelSpec, ...] = (
    # Tier 1: three general-purpose models with 60 % of the tokens.
    ModelSpec("Llama-3.3-70B-Instruct", 0.25, short_output_share=0.35, burst_rpm=30, tpot_s=0.035),
    ModelSpec("Llama-3.1-70B-Instruct", 0.195, short_output_share=0.45, burst_rpm=45, tpot_s=0.035),
    ModelSpec(
        "DeepSeek-R1-Distill-Llama-70B",
        0.155,
        reasoning=True,
        long_prompt_share=0.9,
        burst_share=0.5,
        burst_rpm=12,
        burst_minutes=4.0,
        tpot_s=0.035,
    ),
    # Tier 2: multi-modal models, the community's own models, and the Qwen3-Next pair of Fig. 14.
    ModelSpec("Qwen3-32B", 0.075, output_drift_sigma=0.45, burst_rpm=35, tpot_s=0.025),
    ModelSpec("Qwen2.5-VL-72B-Instruct", 0.065, input_median=900, burst_rpm=50, tpot_s=0.035),
    ModelSpec(
        "Qwen3-Next-80B-A3B-Thinking",
        0.06,
        reasoning=True,
        prefix_reuse=0.94,
        history_keep=0.15,
        burst_share=0.2,
        burst_rpm=6,
        start_frac=0.6,
        tpot_s=0.012,
    ),
    ModelSpec("Apertus-70B-Instruct", 0.055, burst_rpm=60, start_frac=0.45, tpot_s=0.035),
    ModelSpec("Apertus-8B-Instruct", 0.045, burst_rpm=110, start_frac=0.45, tpot_s=0.012),
    ModelSpec(
        "Qwen3-Next-80B-A3B-Instruct", 0.04, prefix_reuse=0.15, burst_rpm=40, start_frac=0.6, tpot_s=0.012
    ),
    ModelSpec("gemma-3-27b-it", 0.03, burst_rpm=25, tpot_s=0.025),
    # Tier 3: the long tail.
    *(
        ModelSpec(
            name, share, reasoning=name in _TAIL_REASONING, burst_rpm=15 + 7 * i, start_frac=0.05 * (i % 5)
        )
        for i, (name, share) in enumerate(_TAIL)
    ),
)
"""22 models in three tiers of token share: 3 with 60 %, 7 with 37 %, 12 with 3 %."""

FIGURE_MODELS = {
    "burst": ("Llama-3.1-70B-Instruct", "Qwen2.5-VL-72B-Instruct", "Apertus-8B-Instruct", "QwQ-32B"),
    "lengths": (
        "Llama-3.1-70B-Instruct",
        "Llama-3.3-70B-Instruct",
        "DeepSeek-R1-Distill-Llama-70B",
        "Qwen3-32B",
    ),
    "ratio": ("Qwen3-32B",),
    "reuse": ("Qwen3-Next-80B-A3B-Thinking", "Qwen3-Next-80B-A3B-Instruct"),
}
"""The models of the default catalog that play the paper's named models in Figs. 11-14."""


# --- fitting ------------------------------------------------------------------------------------------------


def _lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for log X ~ N(mu, sigma^2)."""
    log_cap = math.log(cap)
    below = math.exp(mu + sigma**2 / 2) * _Z.cdf((log_cap - mu - sigma**2) / sigma)
    return below + cap * (1 - _Z.cdf((log_cap - mu) / sigma))


@dataclass(frozen=True)
class Fit:
    """What the generator derives from the specs: request weights and the output length distributions."""

    request_share: tuple[float, ...]
    """Per model (in catalog order), the share of requests that gives it its token share."""
    body_mu: float
    body_sigma: float
    """Log-normal of non-reasoning outputs that are not 1-2 tokens, chosen so that all non-reasoning outputs,
    1-2 token answers included, have the target P50 and P95."""
    reasoning_mu: float
    reasoning_sigma: float


def fit(models: tuple[ModelSpec, ...], params: SyntheticParams) -> Fit:
    """Request shares and output distributions for the targets (a fixed point: shares and lengths depend on
    each other through the share of 1-2 token answers)."""
    if not models:
        raise ValueError("a synthetic trace needs at least one model")
    shares = np.array([m.token_share for m in models], dtype=np.float64)
    r_mu = math.log(params.reasoning_output_p50)
    r_sigma = math.log(params.reasoning_output_p95 / params.reasoning_output_p50) / _Z95
    cap = float(params.max_output_tokens)
    weights = shares / shares.sum()
    mu = sigma = math.nan
    for _ in range(50):
        plain = np.array([not m.reasoning for m in models])
        short = np.array([m.short_output_share for m in models])
        f = float((weights * short)[plain].sum() / weights[plain].sum()) if plain.any() else 0.0
        if f >= 0.5:
            raise ValueError(
                f"{f:.0%} of non-reasoning answers are 1-2 tokens: no body can give the target median"
            )
        z50 = _Z.inv_cdf((0.5 - f) / (1 - f))
        z95 = _Z.inv_cdf((0.95 - f) / (1 - f))
        sigma = math.log(params.non_reasoning_output_p95 / params.non_reasoning_output_p50) / (z95 - z50)
        mu = math.log(params.non_reasoning_output_p50) - z50 * sigma
        mean_tokens = []
        for m in models:
            if m.reasoning:
                out = _lognormal_mean(r_mu, r_sigma, cap)
            else:
                drift = math.hypot(sigma, m.output_drift_sigma)
                out = 1.5 * m.short_output_share + (1 - m.short_output_share) * _lognormal_mean(
                    mu, drift, cap
                )
            first = m.long_prompt_share * m.long_prompt_tokens + (1 - m.long_prompt_share) * _lognormal_mean(
                math.log(m.input_median), m.input_sigma, params.max_input_tokens
            )
            user = math.exp(math.log(params.user_turn_median) + params.user_turn_sigma**2 / 2)
            turns = 1 / (1 - m.prefix_reuse)
            # Over sessions with geometric turns of mean T, prompts average first + (T - 1) * growth per turn.
            mean_tokens.append(first + (turns - 1) * (user + m.history_keep * out) + out)
        new = shares / np.array(mean_tokens)
        new /= new.sum()
        if np.allclose(new, weights, rtol=1e-12, atol=0):
            break
        weights = new
    return Fit(tuple(float(w) for w in weights), mu, sigma, r_mu, r_sigma)


def _counts(total: int, shares: tuple[float, ...]) -> Ints:
    """`total` split by `shares`, largest remainders first, so the counts add up exactly."""
    exact = np.array(shares) * total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: total - int(counts.sum())]] += 1
    return counts


# --- generation ---------------------------------------------------------------------------------------------


def _intensity(days: int) -> Floats:
    """Relative arrival rate per minute: a working-day peak around 13:00 UTC and quiet weekends."""
    minute = np.arange(days * MINUTES_PER_DAY)
    hour = (minute % MINUTES_PER_DAY) / 60.0
    weekday = (minute // MINUTES_PER_DAY) % 7 < 5
    return (0.15 + np.exp(-0.5 * ((hour - 13.0) / 3.5) ** 2)) * np.where(weekday, 1.0, 0.35)


def _arrivals(rng: np.random.Generator, n: int, spec: ModelSpec, intensity: Floats) -> Floats:
    """Seconds from the trace's start of `n` arrivals: a diurnal Poisson background plus bursts, each a cluster
    of requests at `burst_rpm` for an exponential time (a Poisson cluster process, Hawkes-like)."""
    weights = intensity.copy()
    weights[: int(spec.start_frac * weights.size)] = 0.0
    weights /= weights.sum()
    n_burst = round(n * spec.burst_share)
    sizes: list[int] = []
    lengths: list[float] = []
    while sum(sizes) < n_burst:
        minutes = max(0.5, float(rng.exponential(spec.burst_minutes)))
        sizes.append(min(n_burst - sum(sizes), max(2, int(rng.poisson(spec.burst_rpm * minutes)))))
        lengths.append(minutes * 60.0)
    starts = rng.choice(weights.size, size=len(sizes), p=weights) * 60.0 + rng.uniform(0, 60, len(sizes))
    burst = [s + rng.uniform(0, d, k) for s, d, k in zip(starts, lengths, sizes, strict=True)]
    minute = np.repeat(np.arange(weights.size), rng.multinomial(n - n_burst, weights))
    return np.sort(np.concatenate([*burst, minute * 60.0 + rng.uniform(0, 60, minute.size)]))


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> Floats:
    return median * np.exp(sigma * rng.standard_normal(size))


@dataclass
class _Block:
    """One model's requests as arrays, in session order (a session's turns consecutive)."""

    spec: ModelSpec
    unit: Ints
    """Session (or single request) index of each request."""
    first: npt.NDArray[np.bool_]
    """First turn of its session."""
    start: Floats
    """Arrival of the request's session."""
    inp: Ints
    out: Ints
    max_tokens: npt.NDArray[np.int64]
    """-1 where the request named no cap."""
    ttft: Floats
    e2e: Floats


def _block(
    rng: np.random.Generator, spec: ModelSpec, n: int, fit_: Fit, params: SyntheticParams, intensity: Floats
) -> _Block:
    if spec.prefix_reuse > 0:
        turns = rng.geometric(1 - spec.prefix_reuse, size=max(1, n))
        turns = turns[: int(np.searchsorted(np.cumsum(turns), n)) + 1]
        turns[-1] -= int(turns.sum()) - n
    else:
        turns = np.ones(n, dtype=np.int64)
    unit = np.repeat(np.arange(turns.size), turns)
    first = np.ones(n, dtype=bool)
    first[1:] = unit[1:] != unit[:-1]
    start = _arrivals(rng, turns.size, spec, intensity)[unit]

    prompt = np.where(
        rng.random(n) < spec.long_prompt_share,
        spec.long_prompt_tokens * (1 + 0.02 * rng.standard_normal(n)),
        _lognormal(rng, spec.input_median, spec.input_sigma, n),
    )
    if spec.reasoning:
        out_f = np.exp(fit_.reasoning_mu + fit_.reasoning_sigma * rng.standard_normal(n))
    else:
        day = (start // 86_400).astype(np.int64)
        drift = _ar1(rng, int(day.max()) + 1, spec.output_drift_sigma)[day]
        out_f = np.exp(fit_.body_mu + drift + fit_.body_sigma * rng.standard_normal(n))
        short = rng.random(n) < spec.short_output_share
        out_f[short] = rng.integers(1, 3, int(short.sum()))
    cap = params.max_output_tokens if spec.reasoning else 4_096
    max_tokens = np.where(rng.random(n) < 0.5, cap, -1)
    out = np.clip(np.rint(out_f), 1, np.where(max_tokens > 0, max_tokens, params.max_output_tokens)).astype(
        np.int64
    )

    # A later turn's prompt is the previous prompt, the kept part of its answer and the user's new message.
    added = np.rint(spec.history_keep * np.concatenate(([0], out[:-1]))) + _lognormal(
        rng, params.user_turn_median, params.user_turn_sigma, n
    )
    step = np.where(first, np.maximum(np.rint(prompt), 1), np.rint(added))
    total = np.cumsum(step)
    inp = (total - np.repeat(total[first] - step[first], turns)).astype(np.int64)
    inp = np.minimum(inp, params.max_input_tokens)

    ttft = (0.2 + inp / 20_000.0) * np.exp(0.5 * rng.standard_normal(n))
    e2e = ttft + out * spec.tpot_s * np.exp(0.35 * rng.standard_normal(n))
    return _Block(spec, unit, first, start, inp, out, max_tokens, ttft, e2e)


def _ar1(rng: np.random.Generator, n: int, sigma: float, phi: float = 0.85) -> Floats:
    """A stationary AR(1) walk of `n` steps with standard deviation `sigma`."""
    walk = np.zeros(n)
    if sigma > 0:
        noise = rng.standard_normal(n) * sigma * math.sqrt(1 - phi**2)
        walk[0] = rng.standard_normal() * sigma
        for i in range(1, n):
            walk[i] = phi * walk[i - 1] + noise[i]
    return walk


def _hex_pool(rng: np.random.Generator, n: int) -> list[str]:
    """`n` random 64-bit block hashes, hex; a fresh block stands for a prefix no other request shares."""
    text = rng.integers(0, 2**63 - 1, size=n, dtype=np.int64).astype(">u8").tobytes().hex()
    return [text[i : i + 16] for i in range(0, len(text), 16)]


def _records(rng: np.random.Generator, block: _Block, params: SyntheticParams) -> list[TraceRecord]:
    spec, n = block.spec, block.inp.size
    # The next turn comes after the previous answer and the user's think time.
    wait = np.concatenate(([0.0], block.e2e[:-1])) + rng.exponential(params.think_time_s, n)
    wait[block.first] = 0.0
    since = np.cumsum(wait)
    since -= np.repeat(since[block.first], np.bincount(block.unit))
    when = params.start_unix + block.start + since

    # A later turn repeats the previous prompt's full blocks; every other block of it is new.
    kept = np.zeros(n, dtype=np.int64)
    kept[1:] = block.inp[:-1] // PREFIX_BLOCK_TOKENS
    kept[block.first] = 0
    blocks = -(-block.inp // PREFIX_BLOCK_TOKENS)
    kept = np.minimum(kept, blocks)
    pool = _hex_pool(rng, int((blocks - kept).sum()))
    temps = rng.choice(np.array([0.0, 0.6, 0.7, 1.0]), size=n, p=[0.2, 0.3, 0.3, 0.2])
    top_p = np.where(rng.random(n) < 0.7, 1.0, 0.95)
    sessions = spec.prefix_reuse > 0
    out: list[TraceRecord] = []
    at = 0
    previous: tuple[str, ...] = ()
    for i in range(n):
        fresh = int(blocks[i] - kept[i])
        hashes = previous[: kept[i]] + tuple(pool[at : at + fresh])
        at += fresh
        previous = hashes
        out.append(
            TraceRecord(
                timestamp=float(when[i]),
                model=spec.name,
                input_tokens=int(block.inp[i]),
                output_tokens=int(block.out[i]),
                temperature=float(temps[i]),
                top_p=float(top_p[i]),
                max_tokens=int(block.max_tokens[i]) if block.max_tokens[i] > 0 else None,
                e2e_s=float(block.e2e[i]),
                ttft_s=float(block.ttft[i]),
                reasoning=spec.reasoning,
                prefix_hashes=hashes,
                session=f"{spec.name}/{block.unit[i]}" if sessions else None,
            )
        )
    return out


def synthetic_trace(
    seed: int = 0,
    n_requests: int = 100_000,
    days: int = 90,
    *,
    models: tuple[ModelSpec, ...] = DEFAULT_MODELS,
    params: SyntheticParams | None = None,
) -> list[TraceRecord]:
    """A synthetic trace of exactly `n_requests` over `days`, in arrival order, with the paper's shape."""
    if n_requests < 1 or days < 1:
        raise ValueError("a synthetic trace needs at least one request and one day")
    params = params or SyntheticParams()
    rng = np.random.default_rng(seed)
    fit_ = fit(models, params)
    intensity = _intensity(days)
    blocks = [
        _block(rng, spec, int(n), fit_, params, intensity)
        for spec, n in zip(models, _counts(n_requests, fit_.request_share), strict=True)
        if n > 0
    ]
    # E2E latency is scaled per class so that its P95 is the published one; the shape stays the model's.
    for reasoning, target in ((True, params.reasoning_e2e_p95_s), (False, params.non_reasoning_e2e_p95_s)):
        chosen = [b for b in blocks if b.spec.reasoning == reasoning]
        if chosen:
            p95 = float(np.percentile(np.concatenate([b.e2e for b in chosen]), 95, method="inverted_cdf"))
            for b in chosen:
                b.e2e *= target / p95
                b.ttft *= target / p95
    records = [r for b in blocks for r in _records(rng, b, params)]
    records.sort(key=lambda r: r.timestamp)
    return records
