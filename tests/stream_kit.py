"""Stream helpers shared by the fabric's unit and integration tests: an echo handler, reading to EOF, polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentela._types import Stream


async def echo(stream: Stream) -> None:
    """Send back everything until EOF, then half-close."""
    while chunk := await stream.read():
        await stream.write(chunk)
    await stream.write_eof()


async def read_all(stream: Stream) -> bytes:
    """Everything up to EOF."""
    parts = []
    while chunk := await stream.read():
        parts.append(chunk)
    return b"".join(parts)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `predicate` until true; fail the test after `timeout`."""
    async with asyncio.timeout(timeout):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.005)
