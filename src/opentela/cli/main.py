"""The `otela` command line: a table of commands, each in its own module, imported only when it runs.

A command module has `add_arguments(parser)` and `run(args) -> int`. `otela --help` and `otela version` import
no command's dependencies (aiohttp, FastAPI, SQLAlchemy, numpy, OR-Tools), so they answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import NamedTuple

from opentela.errors import ConfigError, OpenTelaError


class Command(NamedTuple):
    """One `otela` command: its name, the module that builds and runs it, and its line in `otela --help`."""

    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("start", "opentela.cli.start", "start a node (and its engine)"),
    Command(
        "slurm", "opentela.cli.slurm", "write (and with --submit, submit) a Slurm job running a worker node"
    ),
    Command("demo", "opentela.cli.demo", "a local mesh: an ingress and two embedded-engine workers"),
    Command(
        "frontend",
        "opentela.cli.frontend",
        "the API frontend: keys, limits, usage, dashboard, in front of an ingress",
    ),
    Command("keys", "opentela.cli.keys", "create, list, revoke, rotate API keys; usage; trace export"),
    Command("status", "opentela.cli.status", "print the mesh as seen by an ingress"),
    Command("engine", "opentela.cli.engine", "run an engine in the foreground"),
    Command("network", "opentela.cli.network", "closed networks: network key and join tokens"),
    Command("simulate", "opentela.cli.simulate", "simulate serving a model on a device type"),
    Command("plan", "opentela.cli.plan", "place models on a cluster's idle devices (CP-SAT)"),
    Command(
        "controller", "opentela.cli.controller", "assign catalog models to idle nodes (fleet controller)"
    ),
    Command("bench", "opentela.cli.bench", "measure an OpenAI-compatible endpoint"),
    Command("profile", "opentela.cli.profile", "measure a performance profile against a live engine"),
    Command("trace", "opentela.cli.trace", "a trace's workload statistics and plots; synthetic traces"),
    Command("version", "opentela.cli.version", "print the version"),
    Command("config", "opentela.cli.config", "configuration helpers"),
)
_BY_NAME = {c.name: c for c in COMMANDS}


def command_module(name: str) -> ModuleType:
    """The module of command `name` (imported now)."""
    return importlib.import_module(_BY_NAME[name].module)


def build_parser(only: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of `otela`: every command's flags, or with `only` just those commands' (the rest by name)."""
    parser = argparse.ArgumentParser(
        prog="otela", description="OpenTela: one OpenAI endpoint over a mesh of nodes."
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help)
        if only is None or command.name in only:
            command_module(command.name).add_arguments(p)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first word that is not an option), if it names one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in _BY_NAME else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `otela` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = chosen_command(argv)
    args = build_parser(only=() if name is None else (name,)).parse_args(argv)
    try:
        return int(command_module(args.cmd).run(args))
    except (ConfigError, OpenTelaError) as exc:
        print(f"otela: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


__all__ = ["COMMANDS", "Command", "build_parser", "chosen_command", "command_module", "main"]
