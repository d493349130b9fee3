"""Bootstrap backoff without sockets: retries, growing jittered delays, self-addresses, giving up."""

from __future__ import annotations

import random

import pytest

from opentela.errors import HandshakeError, PeerUnreachableError
from opentela.fabric.bootstrap import backoff_delay, bootstrap


class FakeNet:
    """`connect` that fails until a given round; records the delays slept."""

    def __init__(self, answers_from_round: int, self_addr: str = "") -> None:
        self.answers_from_round = answers_from_round
        self.self_addr = self_addr
        self.round = 1
        self.calls: list[str] = []
        self.slept: list[float] = []

    async def connect(self, addr: str) -> str:
        self.calls.append(addr)
        if addr == self.self_addr:
            raise HandshakeError("dialed ourselves", self_dial=True)
        if self.round < self.answers_from_round:
            raise PeerUnreachableError(f"{addr} refused")
        return "peer-" + addr

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.round += 1


async def test_retries_until_a_peer_answers_with_growing_capped_delays() -> None:
    net = FakeNet(answers_from_round=6)
    peers = await bootstrap(
        net.connect,
        ["a:1", "b:2", "a:1"],
        initial_delay=1.0,
        max_delay=5.0,
        rng=random.Random(3),
        sleep=net.sleep,
    )
    assert peers == ["peer-a:1", "peer-b:2"]
    assert net.calls.count("a:1") == 6  # duplicates collapsed, every round tries every address
    caps = [1.0, 2.0, 4.0, 5.0, 5.0]
    assert len(net.slept) == 5 and all(0 <= d <= c for d, c in zip(net.slept, caps, strict=True))


async def test_gives_up_after_the_attempts() -> None:
    net = FakeNet(answers_from_round=100)
    with pytest.raises(PeerUnreachableError, match="3 rounds"):
        await bootstrap(net.connect, ["a:1"], attempts=3, sleep=net.sleep)
    assert len(net.calls) == 3 and len(net.slept) == 2


async def test_our_own_address_is_dropped() -> None:
    net = FakeNet(answers_from_round=2, self_addr="me:1")
    assert await bootstrap(net.connect, ["me:1", "b:2"], sleep=net.sleep) == ["peer-b:2"]
    assert net.calls == ["me:1", "b:2", "b:2"]
    assert await bootstrap(FakeNet(1, "me:1").connect, ["me:1"]) == []
    assert await bootstrap(net.connect, []) == []


async def test_malformed_address_fails_at_once() -> None:
    with pytest.raises(ValueError):
        await bootstrap(FakeNet(1).connect, ["a:1", "no-port"])


def test_full_jitter_covers_the_interval() -> None:
    rng = random.Random(0)
    delays = [backoff_delay(4, 0.5, 30.0, rng) for _ in range(2000)]
    assert 0 <= min(delays) < 0.2 and 3.8 < max(delays) <= 4.0
