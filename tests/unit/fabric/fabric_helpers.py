"""Helpers for fabric tests: short-timeout config, an echo handler, polling."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from opentela._types import Stream
from opentela.fabric._config import FabricConfig

if TYPE_CHECKING:
    from opentela.fabric.host import Host

FAST = FabricConfig(dial_timeout=2.0, handshake_timeout=2.0, keepalive_interval=5.0, keepalive_timeout=2.0)

HostFactory = Callable[..., Awaitable["Host"]]


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


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
