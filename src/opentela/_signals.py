"""SIGINT and SIGTERM as a request to stop: one way to install the handlers and to put the previous ones back."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signals(callback: Callable[..., object], *args: Any) -> Callable[[], None]:
    """Call `callback(*args)` on SIGINT or SIGTERM; the returned function restores the previous handling.

    Inside a running event loop the callback runs in the loop (`loop.add_signal_handler`), so it may touch
    asyncio objects. Outside one it runs as a plain signal handler in the main thread, where it should only set
    a flag such as a `threading.Event`.
    """
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        running = loop
        for sig in STOP_SIGNALS:
            running.add_signal_handler(sig, callback, *args)

        def remove() -> None:
            for sig in STOP_SIGNALS:
                running.remove_signal_handler(sig)

        return remove

    previous = {sig: signal.signal(sig, lambda *_: callback(*args)) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
