"""SIGINT/SIGTERM as a stop request, inside and outside an event loop, and the previous handling put back."""

from __future__ import annotations

import asyncio
import signal
import threading

from opentela._signals import STOP_SIGNALS, on_stop_signals


async def test_in_a_loop_the_callback_runs_in_the_loop_with_its_arguments() -> None:
    calls: list[tuple[str, int]] = []
    got = asyncio.Event()

    def stop(code: int) -> None:
        calls.append((threading.current_thread().name, code))
        got.set()

    restore = on_stop_signals(stop, 7)
    try:
        signal.raise_signal(signal.SIGTERM)
        await asyncio.wait_for(got.wait(), 5)
        got.clear()
        signal.raise_signal(signal.SIGINT)
        await asyncio.wait_for(got.wait(), 5)
    finally:
        restore()
    assert calls == [(threading.main_thread().name, 7)] * 2
    loop = asyncio.get_running_loop()
    # Nothing is left installed: removing again finds no handler.
    assert not any(loop.remove_signal_handler(sig) for sig in STOP_SIGNALS)


def test_outside_a_loop_it_is_a_plain_handler_and_the_previous_one_comes_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stop = threading.Event()
    restore = on_stop_signals(stop.set)
    try:
        assert all(signal.getsignal(sig) != before[sig] for sig in STOP_SIGNALS)
        signal.raise_signal(signal.SIGTERM)
        assert stop.wait(5)
        stop.clear()
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the handler took it
        assert stop.wait(5)
    finally:
        restore()
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
