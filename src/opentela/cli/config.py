"""`otela config`: print the configuration reference, or the configuration a node would start with."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The actions of `otela config`."""
    actions = parser.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    actions.add_parser("reference", help="print the configuration reference (Markdown)")
    show = actions.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", metavar="FILE")


def run(args: argparse.Namespace) -> int:
    """Print the reference or the effective configuration."""
    from opentela.config import load_config, reference_markdown

    if args.config_cmd == "reference":
        print(reference_markdown(), end="")
    else:
        print(load_config(args.config))
    return 0
