"""Opening a connection to one of a peer's addresses: TCP then TLS, raced across addresses (happy eyeballs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentela._types import PeerId
from opentela.errors import DialTimeout, HandshakeError, PeerUnreachableError
from opentela.fabric.addresses import format_addr
from opentela.fabric.mux import MuxConnection

Target = tuple[str, int, PeerId | None]
"""Host, port and, where known, the peer expected there."""

STAGGER = 0.25
"""Seconds before racing the next address of the same peer, unless the current attempt fails sooner."""


async def open_tls(new_conn: Callable[[], MuxConnection], host: str, port: int) -> MuxConnection:
    """A new outbound connection (from `new_conn`) to host:port, once its TLS handshake is done."""
    conn = new_conn()
    where = format_addr(host, port)
    try:
        await asyncio.get_running_loop().create_connection(lambda: conn, host, port)
    except OSError as exc:
        raise PeerUnreachableError(f"{where}: {exc.strerror or exc}") from exc
    try:
        await conn.secure
    except BaseException:
        conn.abort()
        raise
    if conn.error is not None:
        if isinstance(conn.error, HandshakeError) and conn.error.details.get("timeout"):
            raise DialTimeout(f"TLS with {where} did not finish in time")
        if isinstance(conn.error, HandshakeError):
            raise HandshakeError(f"TLS with {where} failed: {conn.error}") from conn.error
        raise PeerUnreachableError(f"{where} closed the connection during TLS: {conn.error}")
    return conn


async def race(
    new_conn: Callable[[], MuxConnection], targets: list[Target], errors: list[BaseException]
) -> tuple[MuxConnection, Target] | None:
    """Open TLS to `targets` (the next starts after `STAGGER` or a failure); the first to succeed wins, None if
    all fail. Each target tried is removed from `targets` and its error added to `errors`; attempts cut short
    by a cancellation go back into `targets`."""
    attempts: dict[asyncio.Task[MuxConnection], Target] = {}
    pending = list(targets)
    try:
        while True:
            if pending:
                target = pending.pop(0)
                targets.remove(target)
                attempts[asyncio.create_task(open_tls(new_conn, target[0], target[1]))] = target
            if not attempts:
                return None
            done, _ = await asyncio.wait(
                attempts, timeout=STAGGER if pending else None, return_when=asyncio.FIRST_COMPLETED
            )
            winner: tuple[MuxConnection, Target] | None = None
            for task in done:
                target = attempts.pop(task)
                exc = task.exception()
                if exc is not None:
                    errors.append(exc)
                elif winner is None:
                    winner = (task.result(), target)
                else:
                    task.result().abort()
            if winner is not None:
                return winner
    finally:
        for task, target in attempts.items():
            task.cancel()
            targets.append(target)  # interrupted, not failed: still worth a try
        for result in await asyncio.gather(*attempts, return_exceptions=True):
            if isinstance(result, MuxConnection):
                result.abort()
