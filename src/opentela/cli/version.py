"""`otela version`: print the installed version."""

from __future__ import annotations

import argparse

from opentela import __version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`otela version` takes no flags."""


def run(args: argparse.Namespace) -> int:
    """Print `otela <version>`."""
    print(f"otela {__version__}")
    return 0
