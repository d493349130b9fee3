"""`otela bench`: measure an OpenAI-compatible endpoint (today: `otela bench load`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-command per benchmark."""
    from opentela.bench import load

    benchmarks = parser.add_subparsers(dest="bench_cmd", required=True, metavar="BENCHMARK")
    load.add_arguments(
        benchmarks.add_parser("load", help="open-loop Poisson or trace-timed load with a JSON latency report")
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark."""
    from opentela.bench.load import run_from_args

    return run_from_args(args)
