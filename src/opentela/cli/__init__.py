"""The `otela` command line: one module per command, composed by `main`."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the `otela` command line (imports the command's module only when it runs)."""
    from opentela.cli.main import main as _main

    return _main(argv)
