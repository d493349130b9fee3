"""Validate the simulator's step model on a GPU: time prefill and decode steps of real model shapes on CUDA.

Builds Llama-3.1-8B and Qwen3-1.7B from the shipped `config.json` files with random weights (transformers
`from_config`, bf16, SDPA attention), times prefill steps of 16 to 2048 tokens and decode steps of batches 1 to 16
at contexts of 64 to 1500 tokens (the CPU validation's grid), fits the step model on the three points
`otela simulate calibrate` chooses (the smallest decode step, the decode step holding the most context, the
longest prefill) and reports the simulator's error on the others for the catalog device (H100-SXM by default).
Needs torch and transformers (not among the project's dependencies).

On CUDA each step is timed twice over: by the wall clock around an eager forward (what HF transformers pays,
kernel launches from Python included) and by the sum of its kernels' times from the profiler (the GPU's own
work). With `--graphs`, each decode step is also captured once as a CUDA graph on a static cache and its replay
timed, as engines such as vLLM decode. Each series gets its own fit. With `--reference RUN.json` (a run on
another device) the script also calibrates on that run and predicts this one's steps and its speedup over it.

`--tiny` shrinks every config to 2 layers of hidden size 64 and runs on the CPU in seconds: a smoke test of the
script itself, not a validation (the tests run the parts that need no torch). `--reanalyse FILE` fits again the
measurements an earlier run stored, with no torch and no GPU.

    python benchmarks/gpu_validation.py [--gpu H100-SXM] [--repeats 5] [--graphs]
    python benchmarks/gpu_validation.py --gpu H200 --reference docs/benchmarks/gpu_validation.json --out h200.json
    python benchmarks/gpu_validation.py --tiny --device cpu --out /tmp/gpu_validation.json
    python benchmarks/gpu_validation.py --reanalyse docs/benchmarks/gpu_validation.json
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

import numpy as np

from opentela.scheduler.calibration import (
    StepPoint,
    choose_points,
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
from opentela.scheduler.step_model import StepModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _plots import circle_calibration_points

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Llama-3.1-8B-Instruct", "Qwen3-1.7B")
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


def compare(
    points: list[StepPoint], spec: ModelSpec, device: Device, step: StepModel | None = None
) -> dict[str, Any]:
    """Fit on the calibration points `otela simulate calibrate` would choose, predict every point, summarise
    the errors on the others; with `step`, predict with that step model instead (fitted elsewhere)."""
    chosen = choose_points(points) if step is None else []
    if step is None:
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


SERIES = ("wall", "kernels", "graphs")
"""The timings a run may hold: the eager wall clock, the eager kernel sum, and decode as CUDA graph replays on a
static cache beside the prompts' kernel sums (the way engines such as vLLM run them)."""


def series(measured: list[dict[str, Any]], kind: str) -> list[StepPoint] | None:
    """The measured steps of one of `SERIES` (None where the run did not record it for every step)."""
    if kind == "wall":
        return [StepPoint.from_dict(row) for row in measured]
    if not all(row.get("kernel_seconds") for row in measured):
        return None
    if kind == "kernels":
        return [StepPoint.from_dict({**row, "seconds": row["kernel_seconds"]}) for row in measured]
    decodes = [row for row in measured if row.get("decode")]
    if not decodes or not all(row.get("graph_seconds") for row in decodes):
        return None
    return [
        StepPoint.from_dict(
            {**row, "seconds": row["graph_seconds"] if row.get("decode") else row["kernel_seconds"]}
        )
        for row in measured
    ]


def transfer(
    target: list[StepPoint], reference: list[StepPoint], spec: ModelSpec, device: Device, ref_device: Device
) -> dict[str, Any]:
    """Calibrate on the reference device's run, predict the target device's steps and its speedup over the
    reference, step by step (the paper's test: relative speedups across devices)."""
    step = fit_step_model(choose_points(reference), spec, ref_device, PRECISION)
    result = compare(target, spec, device, step)
    by_shape = {shape(p): p for p in reference}
    speedups = []
    for row, p in zip(result["points"], target, strict=True):
        ref = by_shape.get(shape(p))
        if ref is None:
            continue
        measured = ref.seconds / p.seconds
        predicted = predict(ref, spec, ref_device.with_step(step), PRECISION) / (row["predicted_ms"] / 1000)
        row["measured_speedup"], row["predicted_speedup"] = measured, predicted
        speedups.append((predicted / measured - 1) * 100)
    result["reference_device"] = ref_device.name
    result["speedup_error"] = {
        "points": float(len(speedups)),
        "mean_abs_pct": round(float(np.mean(np.abs(speedups))), 2),
        "max_abs_pct": round(float(np.max(np.abs(speedups))), 2),
        "bias_pct": round(float(np.mean(speedups)), 2),
    }
    return result


def best_of(repeats: int, run: Callable[[], float]) -> float:
    """The fastest of `repeats` timed runs (after one untimed warm-up)."""
    run()
    return min(run() for _ in range(repeats))


class StepTimer:
    """One model built from a config on a torch device, and the ways its steps are timed."""

    def __init__(self, config: dict[str, Any], device_name: str, repeats: int) -> None:
        import torch  # type: ignore[import-not-found]
        from transformers import AutoConfig, AutoModelForCausalLM  # type: ignore[import-not-found]

        self.torch, self.repeats = torch, repeats
        self.dev = torch.device(device_name)
        self.cfg = AutoConfig.for_model(**{**config, "dtype": "bfloat16"})
        with self.dev:
            self.model = AutoModelForCausalLM.from_config(
                self.cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
            ).eval()
        self.vocab = int(config["vocab_size"])

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def ids(self, batch: int, tokens: int) -> Any:
        return self.torch.randint(0, self.vocab, (batch, tokens), device=self.dev)

    def forward(self, ids: Any, **kwargs: Any) -> Any:
        """One forward step, keeping only the last position's logits, as a serving engine samples."""
        return self.model(input_ids=ids, logits_to_keep=1, use_cache=True, **kwargs)

    def timed(self, run: Callable[[], Any]) -> float:
        self.sync()
        t0 = time.perf_counter()
        run()
        self.sync()
        return time.perf_counter() - t0

    def kernel_seconds(self, run: Callable[[], Any]) -> float | None:
        """The summed kernel times of one `run` (the profiler's CUDA activity; one stream, so no overlap)."""
        if self.dev.type != "cuda":
            return None
        from torch.profiler import ProfilerActivity, profile  # type: ignore[import-not-found]

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            self.sync()
        total_us = 0.0
        for event in prof.key_averages():
            value = getattr(event, "self_device_time_total", None)
            if value is None:
                value = getattr(event, "self_cuda_time_total", 0.0)
            total_us += float(value)
        return total_us / 1e6 if total_us > 0 else None

    def prefill(self, tokens: int) -> dict[str, Any]:
        """A prompt of `tokens` in one forward: the fastest wall time and the kernel sum."""
        ids = self.ids(1, tokens)
        seconds = best_of(self.repeats, lambda: self.timed(lambda: self.forward(ids)))
        return {"seconds": seconds, "kernel_seconds": self.kernel_seconds(lambda: self.forward(ids))}

    def decode(self, batch: int, context: int) -> dict[str, Any]:
        """One decode step of `batch` sequences of `context` tokens, on the model's default (dynamic) cache."""
        cache = self.forward(self.ids(batch, context)).past_key_values
        step_ids = self.ids(batch, 1)
        # Each timed step appends one token to the cache: contexts grow by `repeats` + 1, negligible.
        steps = [
            self.timed(lambda: self.forward(step_ids, past_key_values=cache)) for _ in range(self.repeats + 1)
        ]
        kernels = self.kernel_seconds(lambda: self.forward(step_ids, past_key_values=cache))
        return {"seconds": min(steps[1:]), "kernel_seconds": kernels}

    def graph_decode(self, batch: int, context: int) -> dict[str, Any]:
        """The same step on a static cache, captured once as a CUDA graph and replayed, as engines such as vLLM
        decode: the replay's wall time, and the kernel sum of the same step run eagerly on that cache."""
        from transformers import StaticCache  # type: ignore[import-not-found]

        torch = self.torch
        cache = StaticCache(config=self.cfg, max_cache_len=context + 8)
        self.forward(
            self.ids(batch, context),
            past_key_values=cache,
            cache_position=torch.arange(context, device=self.dev),
        )
        step_ids, position = self.ids(batch, 1), torch.tensor([context], device=self.dev)

        def rewind() -> None:
            # The static layers count what they hold and write there; set it back before every step so each
            # step writes the same slot and the captured graph never runs past the cache.
            for layer in cache.layers:
                layer.cumulative_length.fill_(context)

        def step() -> Any:
            return self.forward(step_ids, past_key_values=cache, cache_position=position)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                rewind()
                step()
        torch.cuda.current_stream().wait_stream(side)
        rewind()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

        def replay() -> float:
            rewind()
            return self.timed(graph.replay)

        seconds = best_of(self.repeats, replay)
        rewind()
        return {"graph_seconds": seconds, "static_kernel_seconds": self.kernel_seconds(step)}


def time_steps(
    config: dict[str, Any], points: list[StepPoint], device_name: str, repeats: int, graphs: bool = False
) -> list[dict[str, Any]]:
    """Each point's batch timed on torch: one prefill forward, or one decode forward after a prefill.

    Every row is the point's shape with `seconds` (the fastest wall-clock time) and, on CUDA,
    `kernel_seconds` (the summed kernel times of one more run under the profiler); with `graphs`, decode rows
    also get `graph_seconds` and `static_kernel_seconds` (`StepTimer.graph_decode`), or `graph_error`."""
    timer = StepTimer(config, device_name, repeats)
    timed: list[dict[str, Any]] = []
    with timer.torch.inference_mode():
        for p in points:
            if p.prefill:
                row = {**p.to_dict(), **timer.prefill(p.prefill[0])}
            else:
                row = {**p.to_dict(), **timer.decode(len(p.decode), p.decode[0])}
                if graphs and timer.dev.type == "cuda":
                    try:
                        row.update(timer.graph_decode(len(p.decode), p.decode[0]))
                    except Exception as exc:  # the capture is the fragile part; keep the other series
                        row["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
            timed.append(row)
            shown = "".join(
                f", {name} {row[key] * 1e3:.2f} ms"
                for name, key in (
                    ("kernels", "kernel_seconds"),
                    ("graph", "graph_seconds"),
                    ("static kernels", "static_kernel_seconds"),
                )
                if row.get(key)
            )
            error = f" ({row['graph_error']})" if "graph_error" in row else ""
            label = p.prefill or (len(p.decode), p.decode[0])
            print(
                f"{kind_of(p)} {label}: {row['seconds'] * 1e3:.2f} ms{shown}{error}",
                file=sys.stderr,
                flush=True,
            )
    if timer.dev.type == "cuda":
        timer.torch.cuda.empty_cache()
    return timed


def catalog_device(args: argparse.Namespace, on_cpu: bool) -> Device:
    """The device the simulator predicts for: the host's CPU entry for --tiny or a CPU run, else --gpu."""
    if on_cpu:
        return host_cpu_device(memory_bandwidth_gbs=args.cpu_bandwidth)
    return builtin_catalog()[args.gpu]


def model_spec(name: str, tiny: bool) -> ModelSpec:
    """The simulator's spec of a shipped model (shrunk as --tiny shrinks it)."""
    config = shipped_config(name)
    return spec_from_config(tiny_config(config) if tiny else config, name=name)


def analyse(
    doc: dict[str, Any], device: Device, tiny: bool, reference: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Fit and compare each model's stored measurements, the wall-clock series and the kernel series where the
    run recorded one; with a `reference` run of another device, also predict this run from its calibration."""
    summaries = {"wall": "summary", "kernels": "kernel_summary", "graphs": "graph_summary"}
    for key in (*summaries.values(), "transfer_summary"):
        doc[key] = {}
    for name, model in doc["models"].items():
        spec = model_spec(name, tiny)
        measured = model["measured"]
        for kind in SERIES:
            points = series(measured, kind)
            if points is None:
                continue
            model[kind] = compare(points, spec, device)
            doc[summaries[kind]][name] = model[kind]["summary"]
        if reference is None or name not in reference["models"]:
            continue
        ref_device = builtin_catalog()[reference["device"]]
        # The main series (kernel sums, else the wall clock), then graph replays where both runs have them.
        for kind, key, summary in (
            ("kernels" if "kernels" in model else "wall", "transfer", "transfer_summary"),
            ("graphs", "graph_transfer", "graph_transfer_summary"),
        ):
            ref_points, points = series(reference["models"][name]["measured"], kind), series(measured, kind)
            if ref_points is None or points is None:
                continue
            model[key] = {**transfer(points, ref_points, spec, device, ref_device), "series": kind}
            doc.setdefault(summary, {})[name] = {
                **model[key]["summary"],
                "speedup": model[key]["speedup_error"],
            }
    if reference is not None:
        doc["reference"] = {"device": reference["device"], "torch_device": reference["torch_device"]}
    return doc


COLOURS = ("tab:blue", "tab:orange", "tab:green")


def _scatter_panel(
    ax: Any, series: dict[str, list[dict[str, Any]]], x: str, y: str, band: float, log: bool
) -> tuple[float, float]:
    """One panel: each model's rows as `y` against `x`, by kind, over the diagonal and a +-`band` strip."""
    values: list[float] = []
    for (name, rows), colour in zip(series.items(), COLOURS, strict=False):
        for kind, marker in (("prefill", "o"), ("decode", "s")):
            chosen = [r for r in rows if r["kind"] == kind]
            ax.scatter(
                [r[x] for r in chosen],
                [r[y] for r in chosen],
                marker=marker,
                color=colour,
                label=f"{name} {kind}",
            )
        values += [r[x] for r in rows] + [r[y] for r in rows]
    lo, hi = (min(values) / 1.3, max(values) * 1.3) if log else (min(values) * 0.95, max(values) * 1.05)
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    strip = [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)]
    ax.fill_between([lo, hi], *strip, color="0.9", label=f"within {band:.0%}", zorder=0)
    ax.set(xlim=(lo, hi), ylim=(lo, hi))
    if log:
        ax.set(xscale="log", yscale="log")
    ax.legend(loc="upper left", fontsize=7)
    return lo, hi


def plot(doc: dict[str, Any], path: Path) -> None:
    """Predicted against measured step time (summed kernel times where recorded), each model calibrated on this
    device; beside it, with a reference run, the predicted against the measured speedup over that device."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transfers = {name: m["transfer"] for name, m in doc["models"].items() if "transfer" in m}
    fig, axes = plt.subplots(1, 2 if transfers else 1, figsize=(11 if transfers else 5.5, 5), squeeze=False)
    ax = axes[0][0]
    rows = {name: (m.get("kernels") or m["wall"])["points"] for name, m in doc["models"].items()}
    _scatter_panel(ax, rows, "measured_ms", "predicted_ms", 0.10, log=True)
    circle_calibration_points(ax, [r for points in rows.values() for r in points])
    ax.set(xlabel="measured (ms)", ylabel="predicted (ms)")
    ax.set_title(f"Step time on {doc['device']}, calibrated there (circled: the 3 points)", fontsize=9)
    if transfers:
        ax = axes[0][1]
        speeds = {name: [r for r in t["points"] if "measured_speedup" in r] for name, t in transfers.items()}
        _scatter_panel(ax, speeds, "measured_speedup", "predicted_speedup", 0.06, log=False)
        ref = doc.get("reference", {}).get("device", "reference")
        ax.set(xlabel="measured speedup", ylabel="predicted speedup")
        ax.set_title(f"{doc['device']} over {ref}, calibrated on {ref} only", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace, reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time and compare every model; the JSON document."""
    import torch
    import transformers  # type: ignore[import-not-found]

    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = catalog_device(args, args.tiny or device_name == "cpu")
    doc: dict[str, Any] = {
        "device": device.name,
        "torch_device": torch.cuda.get_device_name() if device_name == "cuda" else "cpu",
        "tiny": args.tiny,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "repeats": args.repeats,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": {},
    }
    for name in args.models:
        config = shipped_config(name)
        if args.tiny:
            config = tiny_config(config)
        measured = time_steps(config, grid(args.quick), device_name, args.repeats, args.graphs)
        doc["models"][name] = {"measured": measured}
        # Each model's measurements kept as soon as they exist: --reanalyse can finish a run cut short.
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return analyse(doc, device, args.tiny, reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="shipped model names")
    parser.add_argument("--gpu", default="H100-SXM", help="catalog device to predict for (H100-SXM)")
    parser.add_argument("--device", help="torch device (default cuda if available)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="2 layers of hidden 64: a CPU smoke test")
    parser.add_argument("--quick", action="store_true", help="a handful of points instead of the grid")
    parser.add_argument(
        "--graphs", action="store_true", help="also time decode steps as CUDA graph replays on a static cache"
    )
    parser.add_argument("--cpu-bandwidth", type=float, default=20.0, help="GB/s for the CPU device entry")
    parser.add_argument("--reanalyse", type=Path, help="fit again the measurements stored in this JSON file")
    parser.add_argument(
        "--reference", type=Path, help="a run on another device: calibrate there, predict this run's steps"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "gpu_validation.json")
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text()) if args.reference else None
    if args.reanalyse:
        doc = json.loads(args.reanalyse.read_text())
        on_cpu = doc["tiny"] or doc["torch_device"] == "cpu"
        device = catalog_device(args, on_cpu) if on_cpu else builtin_catalog()[doc["device"]]
        doc = analyse(doc, device, doc["tiny"], reference)
    else:
        doc = run(args, reference)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if not doc["tiny"]:
        plot(doc, args.out.with_suffix(".png"))
    shown = ("summary", "kernel_summary", "graph_summary", "transfer_summary")
    print(json.dumps({key: doc[key] for key in shown if doc.get(key)}, indent=2))


if __name__ == "__main__":
    main()
