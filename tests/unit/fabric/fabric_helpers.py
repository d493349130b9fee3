"""Helpers for fabric tests: short-timeout config, an echo handler, polling."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from opentela.fabric._config import FabricConfig
from stream_kit import echo, read_all, wait_until  # noqa: F401 (shared with the integration tests)

if TYPE_CHECKING:
    from opentela.fabric.host import Host

FAST = FabricConfig(dial_timeout=2.0, handshake_timeout=2.0, keepalive_interval=5.0, keepalive_timeout=2.0)

HostFactory = Callable[..., Awaitable["Host"]]


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
