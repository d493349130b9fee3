"""Validate the serving simulator against the embedded engine (SmolLM2-135M Q4_1 on llama.cpp) on this CPU.

Starts `otela engine embedded` with 2 threads, measures prefill time against prompt length and decode time per
token against batch size (concurrent requests), all from llama.cpp's own per-request timings; measures this
machine's memory bandwidth with a STREAM-like copy; builds a CPU device entry from /proc/cpuinfo; calibrates ONE
compute-efficiency factor on one prefill point and reports the simulator's error on every other point.
Prints JSON and writes docs/benchmarks/simulator_validation.{json,md} (the summary also goes into simulator.md).

    python benchmarks/simulator_validation.py [--repeats 3] [--calibrate 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from opentela.engines.base import free_port
from opentela.scheduler.hardware import builtin_catalog, host_cpu_device
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import Precision, step_time
from opentela.scheduler.simulator import ReplicaSpec, simulate
from opentela.scheduler.workload import Trace

ROOT = Path(__file__).resolve().parents[1]
THREADS = 2
PROMPT_LENGTHS = (32, 64, 128, 256, 512, 1024)
BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 48
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def memory_bandwidth_gbs(repeats: int = 5) -> float:
    """Best of `repeats` copies of a 256 MiB array: bytes read plus bytes written per second."""
    src = np.ones(32 * 1024 * 1024, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def post(port: int, body: dict, timeout: float = 600.0) -> dict:
    """POST to llama.cpp's native /completion endpoint and return the JSON answer."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def prompt_of(tokens: int, salt: int) -> str:
    """A prompt of roughly `tokens` tokens (one per word), different per salt so no cache is shared."""
    rng = np.random.default_rng(salt)
    return " ".join(rng.choice(WORDS, size=tokens))


def wait_ready(port: int, proc: subprocess.Popen, deadline: float = 180.0) -> None:
    """Poll /health until the model is loaded."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("the embedded engine exited while starting")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the embedded engine did not become ready")


PAPER_CONFIGS = ((1024, 1024, 1), (2048, 512, 4), (512, 2048, 8))
"""Figure 8 of the paper: (input length, output length, batch size)."""


def gpu_speedups() -> list[dict]:
    """Predicted end-to-end time of the paper's three batches on H100 (SXM, PCIe) and RTX 3090, and the ratio."""
    catalog = builtin_catalog()
    rows = []
    for model_name in ("Llama-3.1-8B-Instruct", "Qwen3-1.7B"):
        model = load_model(model_name)
        for inp, out, batch in PAPER_CONFIGS:
            trace = Trace(
                np.zeros(batch), np.full(batch, inp), np.full(batch, out), np.zeros(batch, dtype=np.int64)
            )
            e2e = {
                name: float(np.max(simulate([ReplicaSpec(model, catalog[name])], trace).finish))
                for name in ("H100-SXM", "H100-PCIe", "RTX-3090")
            }
            rows.append(
                {
                    "model": model_name,
                    "config": [inp, out, batch],
                    "e2e_s": e2e,
                    "speedup_h100_sxm": e2e["RTX-3090"] / e2e["H100-SXM"],
                    "speedup_h100_pcie": e2e["RTX-3090"] / e2e["H100-PCIe"],
                }
            )
    return rows


def measure_prefill(port: int, repeats: int) -> list[dict]:
    """Prompt processing time per prompt length, best and median of `repeats`.

    Rounds go over every length in turn, so each length gets its share of the machine's quieter moments.
    """
    runs: dict[int, list[tuple[int, float]]] = {n: [] for n in PROMPT_LENGTHS}
    for r in range(repeats):
        for i, n in enumerate(PROMPT_LENGTHS):
            t = post(port, {"prompt": prompt_of(n, 1000 * i + r), "n_predict": 1, "cache_prompt": False})
            runs[n].append((t["timings"]["prompt_n"], t["timings"]["prompt_ms"]))
        print(f"prefill round {r + 1}/{repeats} done", file=sys.stderr)
    rows = []
    for n in PROMPT_LENGTHS:
        ms = [m for _, m in runs[n]]
        rows.append(
            {
                "prompt_tokens": runs[n][0][0],
                "best_ms": min(ms),
                "median_ms": float(np.median(ms)),
                "runs_ms": ms,
            }
        )
        print(f"prefill {runs[n][0][0]:5d} tokens: best {min(ms):8.1f} ms", file=sys.stderr)
    return rows


def stream_gaps(port: int, body: dict, timeout: float = 600.0) -> list[float]:
    """Stream one completion; the seconds between successive tokens as they arrive."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    stamps = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"content"' in line:
                stamps.append(time.perf_counter())
    return list(np.diff(stamps))


def measure_decode(port: int, repeats: int, prompt_tokens: int = 32) -> list[dict]:
    """Time per decode step with `b` sequences decoding together (b concurrent streamed requests).

    On a loaded machine most steps are stretched by other processes; the 10th percentile of the gaps between
    tokens, over every stream of every repeat, is the least-disturbed step time (the median is reported too).
    """
    rows = []
    for b in BATCHES:
        gaps: list[float] = []
        for r in range(repeats):
            bodies = [
                {
                    "prompt": prompt_of(prompt_tokens, 50_000 + 100 * b + 10 * r + j),
                    "n_predict": DECODE_TOKENS,
                    "ignore_eos": True,
                    "cache_prompt": False,
                }
                for j in range(b)
            ]
            with ThreadPoolExecutor(b) as pool:
                per_stream = list(pool.map(lambda body: stream_gaps(port, body), bodies))
            # Skip each stream's first gaps: the other requests' prompts may still be running then.
            gaps += [g for stream in per_stream for g in stream[4:]]
        ms = 1000 * np.array(gaps)
        ctx = prompt_tokens + DECODE_TOKENS // 2
        rows.append(
            {
                "batch": b,
                "mean_context": ctx,
                "best_ms_per_token": float(np.percentile(ms, 10)),
                "median_ms_per_token": float(np.median(ms)),
                "steps_measured": len(ms),
            }
        )
        print(
            f"decode batch {b}: p10 {np.percentile(ms, 10):7.1f} ms/step, median {np.median(ms):7.1f}",
            file=sys.stderr,
        )
    return rows


def calibrate(predict: Callable[[float], float], measured_s: float) -> float:
    """The compute efficiency in (0, 1] at which `predict` matches `measured_s` (bisection in log space)."""
    low, high = 1e-4, 1.0
    if predict(high) >= measured_s:
        return high
    for _ in range(60):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if predict(mid) > measured_s else (low, mid)
    return (low * high) ** 0.5


def run(repeats: int, calibrate_at: int) -> dict:
    """Measure, calibrate once, predict, compare."""
    load_before = os.getloadavg()
    bandwidth = memory_bandwidth_gbs()
    port = free_port()
    cmd = [sys.executable, "-m", "opentela", "engine", "embedded", "--port", str(port)]
    cmd += ["--threads", str(THREADS), "--parallel", str(max(BATCHES))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        post(port, {"prompt": "warm up", "n_predict": 4})
        prefill = measure_prefill(port, repeats)
        decode = measure_decode(port, repeats)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    load_after = os.getloadavg()

    model = load_model("SmolLM2-135M-Instruct")
    precision = Precision(weights="q4_1", kv_cache="fp16", activations="fp32")
    raw_device = host_cpu_device(threads=THREADS, memory_bandwidth_gbs=bandwidth)
    # ONE factor: the share of peak integer/float throughput llama.cpp reaches, fitted on one prefill point.
    # Memory bandwidth is the measured copy bandwidth, used as is.
    anchor = min(prefill, key=lambda r: abs(r["prompt_tokens"] - calibrate_at))
    efficiency = calibrate(
        lambda e: step_time(
            model, raw_device.calibrated(e), prefill=[anchor["prompt_tokens"]], precision=precision
        ),
        anchor["best_ms"] / 1000,
    )
    device = raw_device.calibrated(efficiency)
    for row in prefill:
        row["predicted_ms"] = 1000 * step_time(
            model, device, prefill=[row["prompt_tokens"]], precision=precision
        )
        row["error_pct"] = 100 * (row["predicted_ms"] - row["best_ms"]) / row["best_ms"]
        row["calibration_point"] = row is anchor
    for row in decode:
        ctx = [row["mean_context"]] * row["batch"]
        row["predicted_ms_per_token"] = 1000 * step_time(model, device, decode=ctx, precision=precision)
        row["error_pct"] = (
            100 * (row["predicted_ms_per_token"] - row["best_ms_per_token"]) / row["best_ms_per_token"]
        )
    others = [abs(r["error_pct"]) for r in prefill if not r["calibration_point"]]
    others += [abs(r["error_pct"]) for r in decode]
    return {
        "engine": "embedded llama.cpp (xllamacpp), SmolLM2-135M-Instruct Q4_1, 2 threads",
        "device": {
            "source": raw_device.source,
            "cores": raw_device.cores,
            "peak_tops": {k: round(v, 4) for k, v in raw_device.tflops.items()},
            "measured_copy_bandwidth_gbs": round(bandwidth, 2),
        },
        "calibration": {"prompt_tokens": anchor["prompt_tokens"], "compute_efficiency": round(efficiency, 4)},
        "prefill": prefill,
        "decode": decode,
        "mean_abs_error_pct_excluding_calibration": round(float(np.mean(others)), 1),
        "max_abs_error_pct_excluding_calibration": round(float(np.max(others)), 1),
        "gpu_speedups": gpu_speedups(),
        "repeats": repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "platform": platform.platform(),
    }


def markdown(doc: dict) -> str:
    """docs/benchmarks/simulator.md: the speedup table, the CPU validation and what limits it."""
    dev, cal = doc["device"], doc["calibration"]
    lines = [
        "# Serving simulator: checks",
        "",
        "Generated by `python benchmarks/simulator_validation.py`; raw numbers in `simulator_validation.json`.",
        "",
        "## H100 over RTX 3090 on the paper's three configurations",
        "",
        "Figure 8 of the paper gives each configuration as (input length, output length, batch size): a batch of",
        "that many requests, all arriving together, and the time until the last one finishes. The paper's",
        "measured speedups are only drawn in the figure (the text gives no numbers); it states that the",
        "simulator's predicted H100 speedup is within 6% of the measured one on all three. Our predictions, pure",
        "roofline with no calibration, fp16 weights and KV cache, vLLM-like batching:",
        "",
        "| model | (in, out, batch) | H100 SXM | H100 PCIe | RTX 3090 | speedup SXM | speedup PCIe |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["gpu_speedups"]:
        e = r["e2e_s"]
        lines.append(
            f"| {r['model']} | {tuple(r['config'])} | {e['H100-SXM']:.2f} s | {e['H100-PCIe']:.2f} s | "
            f"{e['RTX-3090']:.2f} s | {r['speedup_h100_sxm']:.2f}x | {r['speedup_h100_pcie']:.2f}x |"
        )
    lines += [
        "",
        "Decode dominates all three, so the ratio follows memory bandwidth (3.35 TB/s SXM, 2.0 TB/s PCIe, 0.94",
        "TB/s on the 3090: 3.6x and 2.1x), rising a little where the batch's prefill is compute-bound and the",
        "3090's 71 dense fp16 TFLOP/s with fp32 accumulation weigh in (configuration 2).",
        "",
        "## Against the embedded engine on this CPU",
        "",
        f"Engine: {doc['engine']}. Device entry built from {dev['source']}, {dev['cores']} cores; peak "
        + ", ".join(f"{k} {v * 1000:.0f} GOP/s" for k, v in dev["peak_tops"].items())
        + f"; memory bandwidth {dev['measured_copy_bandwidth_gbs']:.1f} GB/s measured by a 256 MiB copy.",
        "Weights Q4_1 (0.625 bytes per weight), linear layers at the int8 rate (llama.cpp quantises activations",
        "to 8 bits for its dot products), attention in fp32 over an fp16 KV cache.",
        "",
        f"**Calibration, once:** a single compute-efficiency factor, fitted on the {cal['prompt_tokens']}-token"
        f" prefill, is **{cal['compute_efficiency']:.3f}** of peak (the measured bandwidth is used as is). Every"
        " other point is a prediction.",
        "",
        f"**Error on the other points: mean {doc['mean_abs_error_pct_excluding_calibration']}%, worst "
        f"{doc['max_abs_error_pct_excluding_calibration']}%** (absolute; prefill against the best of "
        f"{doc['repeats']} runs, decode against the 10th percentile of the step times).",
        "",
        "Prefill (time to process the prompt, from llama.cpp's own timings):",
        "",
        "| prompt tokens | measured (best) | median | predicted | error |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in doc["prefill"]:
        mark = " (calibration)" if r["calibration_point"] else ""
        lines.append(
            f"| {r['prompt_tokens']}{mark} | {r['best_ms']:.0f} ms | {r['median_ms']:.0f} ms | "
            f"{r['predicted_ms']:.0f} ms | {r['error_pct']:+.0f}% |"
        )
    lines += [
        "",
        f"Decode (ms per output token with `batch` requests decoding together, ~{doc['decode'][0]['mean_context']}"
        " tokens of context each):",
        "",
        "| batch | measured (p10 of steps) | median step | predicted | error |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in doc["decode"]:
        lines.append(
            f"| {r['batch']} | {r['best_ms_per_token']:.1f} ms | {r['median_ms_per_token']:.1f} ms | "
            f"{r['predicted_ms_per_token']:.1f} ms | {r['error_pct']:+.0f}% |"
        )
    before, after = doc["loadavg_before"], doc["loadavg_after"]
    lines += [
        "",
        "### Caveats",
        "",
        f"- The machine has {doc['device']['cores']} cores and is shared: load average "
        f"{before[0]:.1f} before and {after[0]:.1f} after the run. llama.cpp's two threads synchronise every "
        "layer, so a third busy process stalls both; medians run far above the best runs, and we compare "
        "against the least-disturbed measurements: the best of the runs for a prompt, the 10th percentile of the "
        "gaps between streamed tokens for decoding. The efficiency factor therefore "
        "also absorbs the load at calibration time.",
        "- A 135M model is an extreme case for the roofline: its matrices are small (576 wide), so per-operator "
        "overheads and thread synchronisation, which the roofline does not model, weigh far more than on a GPU "
        "serving a 13B model; the low efficiency factor says so.",
        "- The roofline uses one efficiency for every operator; attention (fp32, n^2) and the quantised matrix "
        "products reach different shares of peak, which shows as a trend in the prefill error with length.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calibrate", type=int, default=256, help="prompt length of the calibration point")
    parser.add_argument("--render", metavar="JSON", help="only rewrite simulator.md from a saved result")
    args = parser.parse_args()
    out = ROOT / "docs" / "benchmarks"
    if args.render:
        (out / "simulator.md").write_text(markdown(json.loads(Path(args.render).read_text())))
        return
    doc = run(args.repeats, args.calibrate)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulator_validation.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "simulator.md").write_text(markdown(doc))
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
