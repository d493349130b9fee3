"""Performance profiles of LLM-Mesh's models on its CPU and GPU nodes, built from the roofline step model.

LLM-Mesh measures each model's prefill time over input length and decode iteration time over batch x context on
every kind of hardware (its section 5.2). Without the hardware at hand, the same grid is filled from the roofline
model (`scheduler.roofline`) and the profile says `source="simulated"`.

The roofline assumes peak throughput; a serving engine reaches a fraction of it. The fractions below are fitted to
what the paper's Figures 1-3 report for vLLM + OpenVINO on the 32-core Xeon 6462C: Llama-2-7B and -13B meet the TTFT
SLO on that CPU up to 4k tokens while a 22B model does not; a 16-request batch of the 7B model at 1k context decodes
about 69 % slower than one request; and a 32-request batch of the 13B model takes about twice as long per token at
2k context as at 512, missing the 0.25 s TPOT SLO at 2k (tests/unit/scheduler/test_llm_mesh_profiles.py checks them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from opentela.engines.profile import PerformanceProfile, powers_of_two
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import StepCost
from opentela.scheduler.step_model import StepModel

CPU_NODE = "CPU-SPR-6462C-32C"
"""The evaluation's CPU node: a 32-core Xeon Gold 6462C (data/hardware.yaml)."""
GPU_NODE = "A100-80G"
"""The evaluation's GPU node: one A100-80GB."""
MODELS = {"3B": "Llama-3.2-3B", "7B": "Llama-2-7b-hf", "13B": "Llama-2-13b-hf"}
"""The paper's three model sizes (section 8.1), fp16."""
MAX_CONTEXT = 4096
"""L_max: the longest prompt plus output served (Llama-2's window; the profile grid ends here)."""
MAX_BATCH = 256
"""B_max: the most requests one instance batches (vLLM's default max_num_seqs)."""


@dataclass(frozen=True)
class Calibration:
    """How far a serving engine gets from the roofline on one kind of device."""

    efficiency: float
    """Share of peak matrix throughput reached (prefill is compute-bound)."""
    memory_efficiency: float
    """Share of peak memory bandwidth reached (decode is bandwidth-bound)."""
    iteration_overhead_s: float
    """Host-side cost of every iteration (scheduling, sampling, kernel launches)."""


CALIBRATION = {
    # AMX at a quarter of peak and DDR5 at 65 % (about 200 GB/s, a STREAM-like figure) reproduce Figures 1-3.
    "cpu": Calibration(efficiency=0.25, memory_efficiency=0.65, iteration_overhead_s=0.005),
    # A100: typical vLLM prefill MFU and HBM utilisation.
    "gpu": Calibration(efficiency=0.6, memory_efficiency=0.8, iteration_overhead_s=0.003),
}


def hardware_label(device: str) -> str:
    """The `hardware` string a profile of `device` carries, e.g. "cpu:CPU-SPR-6462C-32C"."""
    return f"{builtin_catalog()[device].kind}:{device}"


@cache
def simulated_profile(model: str, device: str, step: StepModel | None = None) -> PerformanceProfile:
    """The profile of `model` (a catalog name) on `device` (a hardware catalog name), filled from the roofline.

    With `step` (a stored calibration of an engine on this device, `otela simulate calibrate`) its per-operator
    efficiencies and per-step overhead apply; without, the device kind's `CALIBRATION` (the paper's setting).
    """
    spec = load_model(model)
    raw = builtin_catalog()[device]
    cal = CALIBRATION["cpu" if raw.kind == "cpu" else "gpu"]
    if step is not None and not step.is_identity:
        dev, overhead = raw.with_step(step), 0.0  # the step model carries its own per-step overhead
    else:
        dev, overhead = raw.calibrated(cal.efficiency, cal.memory_efficiency), cal.iteration_overhead_s
    cost = StepCost(spec, dev, max_tokens=MAX_CONTEXT, max_seqs=MAX_BATCH)
    lengths = powers_of_two(MAX_CONTEXT, 16)
    batches = powers_of_two(MAX_BATCH)
    prefill = tuple(cost.time(n, 1, 0.0, 0, float(n), float(n) * n) + overhead for n in lengths)
    decode = tuple(
        tuple(float(cost.decode_times(b, np.array([float(b * n)]))[0]) + overhead for n in lengths)
        for b in batches
    )
    return PerformanceProfile(
        model=model,
        hardware=hardware_label(device),
        device="cpu" if raw.kind == "cpu" else "gpu",
        prefill_lengths=lengths,
        prefill_s=prefill,
        decode_batches=batches,
        decode_lengths=lengths,
        decode_s=decode,
        weights_bytes=int(spec.weight_bytes("fp16")),
        kv_bytes_per_token=int(spec.kv_bytes_per_token("fp16")),
        source="simulated",
        meta={"roofline": "scheduler.roofline.StepCost", "step_model": dev.step.to_dict()}
        if overhead == 0.0
        else {
            "roofline": "scheduler.roofline.StepCost",
            "efficiency": cal.efficiency,
            "memory_efficiency": cal.memory_efficiency,
            "iteration_overhead_s": cal.iteration_overhead_s,
        },
    )
