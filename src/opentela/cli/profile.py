"""`otela profile`: measure a model's performance profile against a running engine and write it to a file."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentela.engines.profile import PerformanceProfile
    from opentela.engines.profiling import Sample


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `otela profile`."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", metavar="ENGINE_URL", help="base URL of the engine (with or without /v1)")
    source.add_argument(
        "--simulate",
        metavar="DEVICE",
        help="instead of measuring, compute the profile with the simulator's roofline model for DEVICE (a "
        "hardware catalog name, see `otela plan --help`); --model is then a model catalog name or config.json",
    )
    p.add_argument("--model", required=True, help="model id as the engine serves it")
    p.add_argument(
        "--engine",
        default="vllm",
        help="with --simulate: the engine whose stored calibration for DEVICE applies, if any (default vllm)",
    )
    p.add_argument(
        "--step-models",
        metavar="DIR",
        help="with --simulate: directory of calibrations (default $OTELA_STEP_MODELS or "
        "~/.config/opentela/step-models)",
    )
    p.add_argument("--out", metavar="FILE", help="profile file to write (default: profile-MODEL-DEVICE.json)")
    p.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        help="what the engine runs on (default: gpu if this machine has one)",
    )
    p.add_argument(
        "--hardware",
        metavar="TEXT",
        help='what it runs on, e.g. "gpu:H100-80GB" (default: probed on this machine)',
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=2048,
        metavar="N",
        help="longest input sampled, tokens (from 64, by 2x)",
    )
    p.add_argument(
        "--max-batch", type=int, default=32, metavar="N", help="largest decode batch sampled (from 1, by 2x)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, metavar="N", help="prefill requests per length; the median counts"
    )
    p.add_argument(
        "--max-sample-seconds",
        type=float,
        metavar="S",
        default=30.0,
        help="a sample taking longer stops that axis from growing",
    )
    p.add_argument("--json", action="store_true", help="print the profile as JSON instead of a summary")


def default_out(model: str, device: str) -> Path:
    """profile-<model>-<device>.json in the current directory, the model id made safe as a file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-") or "model"
    return Path(f"profile-{safe}-{device}.json")


def _this_machine(device: str | None) -> tuple[str, str]:
    """(device, hardware) of this machine from the hardware probe, for the flags left out."""
    from opentela.node.hardware import probe_hardware

    hw = probe_hardware()
    gpus = hw.get("gpus") or []
    chosen = device or ("gpu" if gpus else "cpu")
    if chosen == "gpu":
        names = sorted({str(g.get("name", "GPU")) for g in gpus})
        return chosen, f"gpu:{len(gpus)}x {'+'.join(names)}" if gpus else "gpu:unknown"
    cpu = hw.get("cpu") or {}
    return chosen, f"{chosen}:{cpu.get('model') or 'unknown'} ({cpu.get('usable', '?')} threads)"


def _progress_line(sample: Sample) -> str:
    tokens = f" ({sample.prompt_tokens} tok)" if sample.prompt_tokens is not None else ""
    if sample.kind == "prefill":
        what = f"prefill      L={sample.length:>6}{tokens}: {sample.seconds * 1000:9.1f} ms to first token"
    else:
        what = f"decode B={sample.batch:>3} L={sample.length:>6}{tokens}: {sample.seconds * 1000:9.2f} ms/iteration"
    note = "  over the budget: this axis stops here" if sample.over_budget else ""
    return f"{what}  [{sample.elapsed_s:.1f} s]{note}"


def _summary(profile: PerformanceProfile, out: Path) -> str:
    meta: dict[str, Any] = profile.meta
    lines = [
        f"{profile.model} on {profile.hardware} ({profile.device}), id {profile.profile_id}, "
        + (
            f"measured in {meta.get('elapsed_s', '?')} s -> {out}"
            if profile.source == "measured"
            else f"{profile.source} -> {out}"
        ),
        "prefill (input tokens: ms to first token): "
        + ", ".join(
            f"{n}: {t * 1000:.1f}" for n, t in zip(profile.prefill_lengths, profile.prefill_s, strict=True)
        ),
        "decode (ms per iteration), batch x context " + " ".join(f"{n:>8}" for n in profile.decode_lengths),
    ]
    for batch, row in zip(profile.decode_batches, profile.decode_s, strict=True):
        lines.append(f"{'':>27}B={batch:<5}" + " ".join(f"{t * 1000:8.2f}" for t in row))
    if meta.get("batch_limit"):
        lines.append(
            f"the engine never decoded {meta['batch_limit']} requests at once: the batches end before"
        )
    if meta.get("truncated"):
        lines.append("the grid is smaller than asked: see meta.measured in the file")
    return "\n".join(lines)


async def _measure(args: argparse.Namespace, device: str, hardware: str) -> PerformanceProfile:
    from opentela.engines.profiling import ProfileSettings, profile_engine

    settings = ProfileSettings(
        url=args.url,
        model=args.model,
        device=device,
        hardware=hardware,
        max_length=args.max_length,
        max_batch=args.max_batch,
        repeat=args.repeat,
        max_sample_s=args.max_sample_seconds,
    )

    def show(sample: Sample) -> None:
        print(_progress_line(sample), file=sys.stderr, flush=True)

    return await profile_engine(settings, show)


def _simulated(args: argparse.Namespace) -> PerformanceProfile:
    """The roofline's profile of `args.model` on `args.simulate` (for hardware not at hand)."""
    from opentela.errors import ConfigError
    from opentela.scheduler.calibration import default_store, find_calibration
    from opentela.scheduler.hardware import builtin_catalog
    from opentela.scheduler.llm_mesh.profiles import simulated_profile

    catalog = builtin_catalog()
    if args.simulate not in catalog:
        raise ConfigError(f"unknown device {args.simulate!r}; known: {', '.join(sorted(catalog))}")
    store = Path(args.step_models) if args.step_models else default_store()
    found = find_calibration(store, args.simulate, args.engine)
    return simulated_profile(args.model, args.simulate, found.step if found else None)


def run(args: argparse.Namespace) -> int:
    """Measure (or simulate), write the profile file, and print a summary (or the profile with --json)."""
    if args.simulate:
        profile = _simulated(args)
        out = Path(args.out) if args.out else default_out(args.model, profile.device)
        _write(profile, out)
        print(json.dumps(profile.to_dict(), indent=1) if args.json else _summary(profile, out))
        return 0
    device, hardware = args.device, args.hardware
    if device is None or hardware is None:
        probed_device, probed_hardware = _this_machine(device)
        device, hardware = device or probed_device, hardware or probed_hardware
    out = Path(args.out) if args.out else default_out(args.model, device)
    print(f"profiling {args.model} at {args.url} ({device}: {hardware})", file=sys.stderr, flush=True)
    profile = asyncio.run(_measure(args, device, hardware))
    _write(profile, out)
    print(json.dumps(profile.to_dict(), indent=1) if args.json else _summary(profile, out))
    return 0


def _write(profile: PerformanceProfile, out: Path) -> None:
    try:
        profile.save(out)
    except OSError as exc:
        from opentela.errors import ConfigError

        raise ConfigError(f"cannot write the profile to {out}: {exc}") from exc
