"""What the long-running commands share: the --log-* flags and running a coroutine as the whole process."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Coroutine
from typing import Any

from opentela._logging import FORMATS


def add_log_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """--log-level and --log-format: they override [log] level and format (OTELA_LOG_LEVEL, OTELA_LOG_FORMAT)."""
    return [
        parser.add_argument("--log-level", help="log level (default INFO)"),
        parser.add_argument("--log-format", choices=FORMATS, help="text or json lines (default text)"),
    ]


def log_flags(args: argparse.Namespace) -> dict[str, str]:
    """The [log] settings given as flags, for `load_config(flags={"log": ...})`."""
    return {k: v for k, v in (("level", args.log_level), ("format", args.log_format)) if v is not None}


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    """Run `coro` to completion in a new event loop (uvloop when installed) and return its exit code."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
