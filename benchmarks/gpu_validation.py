"""Validate the simulator's step model on a GPU: time prefill and decode steps of real model shapes on CUDA.

Builds Llama-3.1-8B and Qwen3-1.7B from the shipped `config.json` files with random weights (transformers
`from_config`, bf16, SDPA attention), times prefill steps of 16 to 2048 tokens and decode steps of batches 1 to 16
at contexts of 64 to 1500 tokens (the CPU validation's grid), fits the step model on three points (decode 1x64,
prefill 512, prefill 2048) and reports the simulator's error on the others for the catalog device (H100-SXM by
default). Needs torch and transformers (not among the project's dependencies).

`--tiny` shrinks every config to 2 layers of hidden size 64 and runs on the CPU in seconds: a smoke test of the
script itself, not a validation (the tests run the parts that need no torch).

    python benchmarks/gpu_validation.py [--gpu H100-SXM] [--repeats 5]
    python benchmarks/gpu_validation.py --tiny --device cpu --out /tmp/gpu_validation.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from opentela.scheduler.calibration import (
    StepPoint,
    error_summary,
    fit_step_model,
    kind_of,
    predict,
    shape,
    validation_grid,
)
from opentela.scheduler.hardware import Device, builtin_catalog, host_cpu_device
from opentela.scheduler.models import ModelSpec, spec_from_config
from opentela.scheduler.roofline import Precision

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Llama-3.1-8B-Instruct", "Qwen3-1.7B")
CALIBRATION = (StepPoint(0.0, decode=(64,)), StepPoint(0.0, prefill=(512,)), StepPoint(0.0, prefill=(2048,)))
PRECISION = Precision("bf16", "bf16", "bf16")
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1024,
}
"""What --tiny overrides in every config: small enough to run the whole grid on a CPU in seconds."""


def shipped_config(name: str) -> dict[str, Any]:
    """The config.json shipped with the scheduler's model catalog."""
    text = resources.files("opentela.scheduler").joinpath(f"data/models/{name}.json").read_text()
    return dict(json.loads(text))


def tiny_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` shrunk to TINY's shape (same architecture, rope and norm settings)."""
    return {**config, **TINY}


def grid(quick: bool = False) -> list[StepPoint]:
    """The steps to time; `quick` keeps a handful (the calibration points among them)."""
    if quick:
        return validation_grid((16, 512, 2048), (1, 4), (64, 512))
    return validation_grid()


def nearest(points: list[StepPoint], target: StepPoint) -> StepPoint:
    """The point of the same kind and batch whose size is closest to `target`'s."""
    same = [p for p in points if kind_of(p) == kind_of(target) and len(p.decode) == len(target.decode)]
    size = sum(target.prefill) + sum(target.decode)
    return min(same, key=lambda p: abs(sum(p.prefill) + sum(p.decode) - size))


def compare(points: list[StepPoint], spec: ModelSpec, device: Device) -> dict[str, Any]:
    """Fit on the three calibration points, predict every point, summarise the errors on the others."""
    chosen = [nearest(points, c) for c in CALIBRATION]
    step = fit_step_model(chosen, spec, device, PRECISION)
    fitted = device.with_step(step)
    used = {shape(p) for p in chosen}
    predicted = [predict(p, spec, fitted, PRECISION) for p in points]
    rows = [
        {
            **p.to_dict(),
            "kind": kind_of(p),
            "measured_ms": p.seconds * 1000,
            "predicted_ms": guess * 1000,
            "error_pct": 100 * (guess / p.seconds - 1),
            "calibration_point": shape(p) in used,
        }
        for p, guess in zip(points, predicted, strict=True)
    ]
    return {"step_model": step.to_dict(), "points": rows, "summary": error_summary(points, predicted, chosen)}


def best_of(repeats: int, run: Callable[[], float]) -> float:
    """The fastest of `repeats` timed runs (after one untimed warm-up)."""
    run()
    return min(run() for _ in range(repeats))


def time_steps(
    config: dict[str, Any], points: list[StepPoint], device_name: str, repeats: int
) -> list[StepPoint]:
    """Each point's batch timed on torch: one prefill forward, or one decode forward after a prefill."""
    import torch  # type: ignore[import-not-found]
    from transformers import AutoConfig, AutoModelForCausalLM  # type: ignore[import-not-found]

    dev = torch.device(device_name)
    dtype = torch.bfloat16
    cfg = AutoConfig.for_model(**{**config, "torch_dtype": "bfloat16"})
    with dev:
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa").eval()
    vocab = int(config["vocab_size"])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def forward(ids: Any, **kwargs: Any) -> Any:
        try:  # only the last position's logits, as a serving engine samples
            return model(input_ids=ids, logits_to_keep=1, use_cache=True, **kwargs)
        except TypeError:
            return model(input_ids=ids, use_cache=True, **kwargs)

    timed = []
    with torch.inference_mode():
        for p in points:
            if p.prefill:
                ids = torch.randint(0, vocab, (1, p.prefill[0]), device=dev)

                def prefill(ids: Any = ids) -> float:
                    sync()
                    t0 = time.perf_counter()
                    forward(ids)
                    sync()
                    return time.perf_counter() - t0

                seconds = best_of(repeats, prefill)
            else:
                batch, context = len(p.decode), p.decode[0]
                out = forward(torch.randint(0, vocab, (batch, context), device=dev))
                cache = out.past_key_values
                step_ids = torch.randint(0, vocab, (batch, 1), device=dev)
                # Each timed step appends one token to the cache: contexts grow by `repeats` + 1, negligible.
                steps = []
                for _ in range(repeats + 1):
                    sync()
                    t0 = time.perf_counter()
                    forward(step_ids, past_key_values=cache)
                    sync()
                    steps.append(time.perf_counter() - t0)
                seconds = min(steps[1:])
            timed.append(StepPoint(seconds, p.prefill, p.decode, p.cached))
            print(
                f"{kind_of(p)} {p.prefill or (len(p.decode), p.decode[0])}: {seconds * 1e3:.2f} ms",
                file=sys.stderr,
            )
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return timed


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time and compare every model; the JSON document."""
    import torch

    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny or device_name == "cpu":
        catalog_device = host_cpu_device(memory_bandwidth_gbs=args.cpu_bandwidth)
    else:
        catalog_device = builtin_catalog()[args.gpu]
    doc: dict[str, Any] = {
        "device": catalog_device.name,
        "torch_device": torch.cuda.get_device_name() if device_name == "cuda" else "cpu",
        "tiny": args.tiny,
        "torch": torch.__version__,
        "models": {},
        "summary": {},
    }
    for name in args.models:
        config = shipped_config(name)
        if args.tiny:
            config = tiny_config(config)
        spec = spec_from_config(config, name=name)
        points = time_steps(config, grid(args.quick), device_name, args.repeats)
        result = compare(points, spec, catalog_device)
        doc["models"][name] = result
        doc["summary"][name] = result["summary"]
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="shipped model names")
    parser.add_argument("--gpu", default="H100-SXM", help="catalog device to predict for (H100-SXM)")
    parser.add_argument("--device", help="torch device (default cuda if available)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="2 layers of hidden 64: a CPU smoke test")
    parser.add_argument("--quick", action="store_true", help="a handful of points instead of the grid")
    parser.add_argument("--cpu-bandwidth", type=float, default=20.0, help="GB/s for the CPU device entry")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "gpu_validation.json")
    args = parser.parse_args()
    doc = run(args)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["summary"], indent=2))


if __name__ == "__main__":
    main()
