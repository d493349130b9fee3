"""Token timing of the simulated engine: fixed latencies, or a roofline estimate for a declared GPU and model.

The same timing can be handed to the token-level executor as a performance profile (`TimingModel.as_profile`), and
`sleep_until` paces tokens in real time against absolute deadlines.

The roofline is deliberately simple: decoding one token streams every weight from GPU memory once (memory
bound), prefill does two FLOPs per parameter per prompt token at a fixed fraction of peak (compute bound).
It stands in until the serving simulator provides calibrated numbers.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError

GPU_SPECS: dict[str, tuple[float, float, int]] = {
    # name: (memory bandwidth GB/s, dense BF16 TFLOP/s, memory GiB), from vendor datasheets
    "B200": (8000, 2250, 180),
    "GH200": (4000, 989, 96),
    "H200": (4800, 989, 141),
    "H100": (3350, 989, 80),
    "MI300X": (5300, 1307, 192),
    "A100": (2039, 312, 80),
    "L40S": (864, 362, 48),
    "A10": (600, 125, 24),
    "L4": (300, 121, 24),
    "T4": (320, 65, 16),
    "CPU": (100, 2, 64),
}
PREFILL_EFFICIENCY = 0.4
"""Fraction of peak FLOP/s a prefill reaches (model FLOP utilisation)."""
DECODE_EFFICIENCY = 0.8
"""Fraction of peak memory bandwidth a decode step reaches."""
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")


async def sleep_until(deadline: float) -> None:
    """Sleep until a `time.monotonic()` deadline (not loop.time: uvloop's clock moves in whole ms).

    Absolute deadlines keep a stream from drifting. Under uvloop the wake-up lands ~0.1-0.2 ms late
    here; a helper thread waking the loop was measured and did no better end to end.
    """
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def gpu_spec(name: str) -> tuple[str, tuple[float, float, int]]:
    """The table entry for a GPU name (``H100``, ``nvidia-h100-80gb``...); ConfigError for unknown ones."""
    upper = name.upper().replace("-", "").replace(" ", "")
    for key in sorted(GPU_SPECS, key=len, reverse=True):
        if key in upper:
            return key, GPU_SPECS[key]
    raise ConfigError(f"unknown GPU {name!r} for the simulated engine; known: {', '.join(GPU_SPECS)}")


def params_from_name(model: str) -> float | None:
    """Billions of parameters named in a model id (``llama-3.1-8b`` -> 8, ``Qwen3-0.6B`` -> 0.6)."""
    sizes = [float(m) for m in _SIZE.findall(model)]
    return sizes[-1] if sizes else None


def bits_of(quantization: str) -> float:
    """Bits per weight of a quantization name; unquantized (empty) is 16."""
    q = quantization.lower()
    if not q or q in ("none", "bf16", "fp16", "float16", "bfloat16"):
        return 16.0
    if q in ("fp8", "int8", "w8a8", "q8_0") or q.startswith("8"):
        return 8.0
    if q in ("awq", "gptq", "int4", "fp4", "nf4") or q.startswith(("q4", "4")):
        return 4.0
    match = re.match(r"q?(\d+)", q)
    return float(match.group(1)) if match else 16.0


@dataclass(frozen=True)
class TimingModel:
    """Per-request TTFT and per-token latency, in seconds."""

    base_ttft_s: float
    """Fixed part of the time to first token."""
    prefill_s_per_token: float
    itl_s: float
    itl_per_active_s: float

    def ttft(self, prompt_tokens: int) -> float:
        """Time to first token of a prompt."""
        return self.base_ttft_s + self.prefill_s_per_token * prompt_tokens

    def itl(self, active: int) -> float:
        """Time between tokens while `active` requests decode together."""
        return self.itl_s + self.itl_per_active_s * max(0, active - 1)

    @classmethod
    def fixed(cls, ttft_ms: float, itl_ms: float, itl_per_active_ms: float) -> TimingModel:
        """Latencies as given, independent of the prompt."""
        return cls(ttft_ms / 1000, 0.0, itl_ms / 1000, itl_per_active_ms / 1000)

    @classmethod
    def roofline(
        cls, gpu: str, params_b: float, quantization: str = "", itl_per_active_ms: float = 0.0
    ) -> TimingModel:
        """Memory-bound decode and compute-bound prefill of a `params_b` billion parameter model on `gpu`."""
        _, (bandwidth_gbs, tflops, _) = gpu_spec(gpu)
        weight_bytes = params_b * 1e9 * bits_of(quantization) / 8
        itl = weight_bytes / (bandwidth_gbs * 1e9 * DECODE_EFFICIENCY)
        prefill = 2 * params_b * 1e9 / (tflops * 1e12 * PREFILL_EFFICIENCY)
        return cls(itl, prefill, itl, itl_per_active_ms / 1000)

    def as_profile(self, model: str) -> PerformanceProfile:
        """The same timing as a performance profile, for the token-level executor: a prefill iteration takes the
        TTFT of its prompt, a decode iteration of a batch of B the ITL with B requests decoding."""
        # Both curves are linear (prefill in the prompt, decode in the batch, neither in the context), so two
        # samples each describe them exactly: the profile extends its end segments linearly.
        return PerformanceProfile(
            model=model,
            hardware="simulated timing model",
            device="gpu",
            prefill_lengths=(1, 2),
            prefill_s=(self.ttft(1), self.ttft(2)),
            decode_batches=(1, 2),
            decode_lengths=(1,),
            decode_s=((self.itl(1),), (self.itl(2),)),
            source="simulated",
        )
