"""`otela trace`: the workload statistics of the paper's section 6.2 for a trace, and synthetic traces."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from opentela.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from opentela.bench.trace_analysis import TraceAnalysis, TraceColumns
    from opentela.bench.traces import TraceRecord


def _synthetic_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace (0)")
    p.add_argument("--requests", type=int, default=100_000, metavar="N", help="requests in it (100000)")
    p.add_argument("--days", type=int, default=90, metavar="D", help="days it spans (90)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`otela trace analyze` and `otela trace synthesize`."""
    from opentela.bench.traces import TRACE_FORMATS

    sub = parser.add_subparsers(dest="trace_cmd", required=True, metavar="ACTION")
    a = sub.add_parser(
        "analyze",
        help="tables, PNG plots and an HTML report of a trace's statistics (Figs. 9-15 of the paper)",
        description="The statistics of the OpenTela paper's workload characterization (section 6.2) for a "
        "trace: tokens per model, burstiness, length CDFs, output ratio, reusable prefixes, reasoning latency.",
    )
    a.add_argument("file", nargs="?", metavar="FILE", help="the trace (any format of docs/traces.md)")
    a.add_argument(
        "--synthetic", action="store_true", help="analyze a generated synthetic trace instead of FILE"
    )
    _synthetic_flags(a)
    a.add_argument("--format", choices=TRACE_FORMATS, default="auto", help="FILE's format (auto)")
    a.add_argument(
        "--model",
        action="extend",
        nargs="+",
        default=[],
        metavar="M",
        help="draw these models in the per-model figures (default: as the paper picks them)",
    )
    a.add_argument(
        "--window",
        default="3600",
        metavar="SECONDS|all",
        help="prefix reuse counts blocks seen within this many seconds before (3600), or in all history",
    )
    a.add_argument(
        "--out",
        default="trace-report",
        metavar="DIR",
        help="folder for the PNGs and report.html (trace-report)",
    )
    a.add_argument("--no-plots", action="store_true", help="tables (and --json) only: write nothing")
    a.add_argument("--json", action="store_true", help="print the statistics as JSON instead of tables")
    s = sub.add_parser("synthesize", help="write a synthetic trace with the paper's published shape")
    s.add_argument(
        "--out", required=True, metavar="FILE", help="where to write it (.csv or .jsonl, optionally .gz)"
    )
    _synthetic_flags(s)


def run(args: argparse.Namespace) -> int:
    """Run `otela trace ACTION`."""
    from rich.console import Console

    progress = Console(stderr=True, highlight=False)
    if args.trace_cmd == "synthesize":
        return synthesize(args, progress)
    return analyze(args, progress)


class _Steps:
    """Progress lines on stderr: what is being done and how long the previous step took."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()

    def __call__(self, text: str, style: str = "") -> None:
        from rich.markup import escape

        line = escape(text) if not style else f"[{style}]{escape(text)}[/]"
        self.console.print(f"[dim]{time.monotonic() - self.started:6.1f} s[/] {line}")


def _synthetic(args: argparse.Namespace, step: _Steps) -> list[TraceRecord]:
    from opentela.bench.trace_synthetic import synthetic_trace

    if args.requests < 1 or args.days < 1:
        raise ConfigError("--requests and --days must be at least 1")
    step(f"generating a synthetic trace: {args.requests:,} requests over {args.days} days (seed {args.seed})")
    return synthetic_trace(args.seed, args.requests, args.days)


def synthesize(args: argparse.Namespace, progress: Console) -> int:
    """Write a synthetic trace."""
    from opentela.bench.traces import write_trace

    step = _Steps(progress)
    records = _synthetic(args, step)
    step(f"writing {args.out}")
    count = write_trace(records, args.out)
    step(f"wrote {count:,} synthetic requests to {args.out}")
    return 0


def _load(args: argparse.Namespace, step: _Steps) -> tuple[list[TraceRecord], str]:
    from opentela.bench.traces import read_trace

    if args.synthetic:
        if args.file:
            raise ConfigError("give a trace FILE or --synthetic, not both")
        return _synthetic(args, step), f"synthetic trace (seed {args.seed}, {args.requests:,} requests)"
    if not args.file:
        raise ConfigError("otela trace analyze needs a trace FILE (or --synthetic)")
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"no trace file at {path}")
    step(f"reading {path}")
    try:
        records = read_trace(path, args.format)
    except ValueError as exc:
        # A reader's own check (a negative count, a record without a model) reads as a bad file, not a crash.
        raise ConfigError(f"cannot read trace {path}: {exc}") from None
    if not records:
        raise ConfigError(f"the trace {path} has no requests")
    return records, str(path)


def _window(text: str) -> float | None:
    if text.strip().lower() in ("all", "none", "inf"):
        return None
    try:
        window = float(text)
    except ValueError:
        raise ConfigError(f"--window: expected seconds or 'all', not {text!r}") from None
    if window <= 0:
        raise ConfigError("--window must be positive (or 'all')")
    return window


def analyze(args: argparse.Namespace, progress: Console) -> int:
    """Analyze a trace file or a synthetic trace; print the tables (or JSON) and write the report."""
    from opentela.bench.trace_analysis import FigureModels, analyze, columns

    step = _Steps(progress)
    window = _window(args.window)
    records, title = _load(args, step)
    step(f"analyzing {len(records):,} requests")
    cols = columns(records)
    del records
    if args.model:
        figures: FigureModels | None = FigureModels.same(args.model)
    elif args.synthetic:
        from opentela.bench.trace_synthetic import FIGURE_MODELS

        figures = FigureModels(**FIGURE_MODELS)
    else:
        figures = None
    try:
        analysis = analyze(cols, figures, window)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        from opentela.bench.trace_report import summary

        print(json.dumps(summary(analysis), indent=2))
    else:
        print_tables(analysis)
    if not args.no_plots:
        _write_report(cols, analysis, Path(args.out), title, step)
    step("done")
    return 0


def print_tables(analysis: TraceAnalysis) -> None:
    """The report's tables on stdout, with Rich."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from opentela.bench.trace_report import tables

    # A pipe or a log file has no width; do not squeeze the tables into 80 columns there.
    console = Console(width=None if sys.stdout.isatty() else 160)
    for t in tables(analysis):
        table = Table(title=Text(t.title), title_justify="left", caption=Text(t.note), caption_justify="left")
        for name, right in zip(t.columns, t.numeric or (False,) * len(t.columns), strict=True):
            table.add_column(name, justify="right" if right else "left", overflow="fold")
        for row in t.rows:
            # Model names come from the trace: plain Text, never console markup.
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def _write_report(cols: TraceColumns, analysis: TraceAnalysis, out: Path, title: str, step: _Steps) -> None:
    from opentela.bench import trace_plots
    from opentela.bench.trace_report import html_report

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {out}: {exc}") from None
    step(f"drawing {len(trace_plots.FIGURES)} figures")
    missing = ""
    try:
        pngs = trace_plots.render(cols, analysis)
    except ConfigError as exc:
        # No Matplotlib: the report still has every table.
        missing, pngs = f"{exc}; the report has the tables only.", {}
        step(missing, "yellow")
    paths = trace_plots.write(pngs, out)
    report = out / "report.html"
    report.write_text(html_report(analysis, pngs, f"Trace analysis: {title}", missing))
    step(f"wrote {report}" + (f" and {len(paths)} PNGs to {out}" if paths else ""))
