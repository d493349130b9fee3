"""Engine log watching: follow the engine's log file and report the first line that means the engine is lost."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable
from pathlib import Path

from opentela.errors import ConfigError

_MAX_LINE = 64 * 1024
"""A line longer than this (no newline yet) is matched as it is rather than buffered further."""
_CHUNK = 1024 * 1024


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """Compile fatal-line patterns, case-insensitively; a bad one is a configuration error naming it."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern, re.IGNORECASE))
        except re.error as exc:
            raise ConfigError(
                f"fatal log pattern {pattern!r} is not a valid regular expression: {exc}"
            ) from exc
    return compiled


class FatalLogWatch:
    """Reads what an engine appended to its log since `offset` and matches each complete line.

    The engine writes the file directly (the supervisor hands it the descriptor), so this follows the file,
    not a pipe: nothing is lost if the node is slow, and the engine never blocks on a full pipe.
    """

    def __init__(self, path: Path, patterns: Iterable[str], *, offset: int = 0) -> None:
        self.path = path
        self.patterns = compile_patterns(patterns)
        self.offset = offset
        self._partial = b""

    def __repr__(self) -> str:
        return f"<FatalLogWatch {self.path} at {self.offset} patterns={len(self.patterns)}>"

    def match(self, line: str) -> re.Pattern[str] | None:
        """The first pattern `line` matches, if any."""
        return next((p for p in self.patterns if p.search(line)), None)

    def scan(self, *, final: bool = False) -> str | None:
        """Read the new bytes and return the first fatal line among them; `final` also matches an unended line."""
        if not self.patterns:
            return None
        try:
            with open(self.path, "rb") as log:
                if log.seek(0, os.SEEK_END) < self.offset:  # truncated or replaced: start over
                    self.offset, self._partial = 0, b""
                log.seek(self.offset)
                while chunk := log.read(_CHUNK):
                    self.offset += len(chunk)
                    found = self._lines(self._partial + chunk)
                    if found is not None:
                        return found
        except OSError:
            return None
        if final and self._partial:
            return self._lines(self._partial + b"\n")
        return None

    def _lines(self, data: bytes) -> str | None:
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            if line and self.match(line):
                return line
        return None

    async def watch(self, interval: float = 0.5) -> str:
        """Scan every `interval` seconds until a fatal line appears; return it."""
        while True:
            line = self.scan()
            if line is not None:
                return line
            await asyncio.sleep(interval)
