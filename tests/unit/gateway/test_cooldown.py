"""Replica cooldown, on a clock the test moves."""

from __future__ import annotations

from meshkit import record

from opentela.gateway.cooldown import ReplicaHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_cool_a_replica_for_a_while() -> None:
    clock = Clock()
    health = ReplicaHealth(threshold=3, cooldown=5.0, clock=clock)
    a, b = record("a"), record("b")
    assert not health.failed("s-a") and not health.failed("s-a")
    health.succeeded("s-a")  # a success ends the streak
    assert not health.failed("s-a") and not health.failed("s-a")
    assert health.failed("s-a")  # third in a row
    assert health.is_cooling("s-a") and health.cooling() == ["s-a"]
    assert list(health.available([a, b])) == [b]
    clock.now += 5.1
    assert not health.is_cooling("s-a")
    assert list(health.available([a, b])) == [a, b]


def test_when_everything_cools_everything_stays_available() -> None:
    health = ReplicaHealth(threshold=1, cooldown=60.0, clock=Clock())
    a = record("a")
    health.failed("s-a")
    assert list(health.available([a])) == [a]


def test_threshold_zero_never_cools() -> None:
    health = ReplicaHealth(threshold=0, cooldown=60.0, clock=Clock())
    assert not any(health.failed("s-a") for _ in range(10))
    assert not health.is_cooling("s-a")
