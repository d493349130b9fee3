"""Clients that hold HTTP connections open the way a slow-header flood does, timing when the server closes them."""

from __future__ import annotations

import asyncio
import contextlib
import time


async def slow_header_client(port: int, interval: float, give_up: float) -> float | None:
    """Send a request head one byte every `interval` seconds; seconds until the server closed, None if it
    never did within `give_up`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 1000

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(interval)

    sender = asyncio.create_task(trickle())
    try:
        await asyncio.wait_for(reader.read(), give_up)  # returns once the server closes the connection
        return time.monotonic() - started
    except ConnectionError:
        return time.monotonic() - started
    except TimeoutError:
        return None
    finally:
        sender.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def idle_client(port: int, give_up: float, *, after_request: bool) -> float | None:
    """Connect (and optionally complete one request), then stay silent: seconds until the server closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if after_request:
            writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
        started = time.monotonic()
        try:
            while await asyncio.wait_for(reader.read(65536), give_up):
                pass
        except ConnectionError:
            pass
        except TimeoutError:
            return None
        return time.monotonic() - started
    finally:
        writer.close()
