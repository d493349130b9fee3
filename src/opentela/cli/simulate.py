"""`otela simulate`: simulate serving one model on one device type; `otela simulate calibrate` fits the
simulator's step model for a (device, engine) pair from a live engine or a profile file."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from opentela.scheduler.commands import add_simulate_arguments, step_model_dir
from opentela.scheduler.commands import run as run_simulation

__all__ = ["add_arguments", "calibrate_command", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `otela simulate` and `otela simulate calibrate`."""
    add_simulate_arguments(p)
    g = p.add_argument_group("calibrate")
    g.add_argument("--url", metavar="ENGINE_URL", help="calibrate: measure the engine at this URL")
    g.add_argument(
        "--profile", metavar="FILE", help="calibrate: use the steps of a profile file (`otela profile`)"
    )
    g.add_argument(
        "--served-model", metavar="ID", help="calibrate --url: model id the engine serves (default --model)"
    )
    g.add_argument(
        "--max-length",
        type=int,
        default=2048,
        metavar="N",
        help="calibrate --url: longest prompt measured, tokens (2048; the engine's context must hold it)",
    )


def _measure(ns: argparse.Namespace, kind: str) -> Any:
    from opentela.engines.profiling import ProfileSettings, profile_engine

    # A small grid: prefills from 64 to --max-length tokens and decode steps; three are fitted, the others are
    # reported as a check. On a CPU one sequence of long context already shows decode attention; a GPU reads
    # its weights so fast that only many sequences of long context do.
    settings = ProfileSettings(
        url=ns.url,
        model=ns.served_model or ns.model,
        device="cpu" if kind == "cpu" else "gpu",
        hardware=ns.gpu,
        max_length=ns.max_length,
        max_batch=1 if kind == "cpu" else 16,
        repeat=3,
    )
    return asyncio.run(profile_engine(settings, lambda s: print(f"{s.kind} {s.length}", file=sys.stderr)))


def calibrate_command(ns: argparse.Namespace) -> dict[str, Any]:
    """Fit and store the step model of (--gpu, --engine); returns what it prints."""
    from opentela.engines.profile import PerformanceProfile
    from opentela.errors import ConfigError
    from opentela.scheduler.calibration import (
        Calibration,
        choose_points,
        fit_step_model,
        predict,
        profile_points,
        recipe,
    )
    from opentela.scheduler.hardware import load_catalog
    from opentela.scheduler.models import load_model
    from opentela.scheduler.roofline import Precision

    if not ns.model or not ns.gpu or bool(ns.url) == bool(ns.profile):
        raise ConfigError("otela simulate calibrate needs --model, --gpu and one of --url or --profile")
    device = load_catalog(ns.hardware)[ns.gpu]
    model = load_model(ns.model)
    precision = Precision(ns.weights, ns.kv_dtype)
    profile = PerformanceProfile.load(Path(ns.profile)) if ns.profile else _measure(ns, device.kind)
    points = profile_points(profile)
    chosen = choose_points(points)
    free, base = recipe(device.kind, ns.engine)
    step = fit_step_model(chosen, model, device, precision, ns.tp, free=free, base=base)
    path = Calibration(device.name, ns.engine, step, model.name, tuple(chosen)).save(step_model_dir(ns))
    fitted = device.with_step(step)
    check = [
        {**p.to_dict(), "predicted": predict(p, model, fitted, precision, ns.tp)}
        for p in points
        if p not in chosen
    ]
    errors = [abs(c["predicted"] / c["seconds"] - 1) for c in check]
    return {
        "device": device.name,
        "engine": ns.engine,
        "model": model.name,
        "step_model": step.to_dict(),
        "stored": str(path),
        "calibration_points": [p.to_dict() for p in chosen],
        "fitted": list(free),
        "check_points": check,
        "mean_abs_error_pct": round(100 * sum(errors) / len(errors), 1) if errors else None,
        "max_abs_error_pct": round(100 * max(errors), 1) if errors else None,
    }


def run(ns: argparse.Namespace) -> int:
    """`otela simulate [run]` or `otela simulate calibrate`."""
    if ns.action != "calibrate":
        return run_simulation(ns)
    print(json.dumps(calibrate_command(ns), indent=2))
    return 0
