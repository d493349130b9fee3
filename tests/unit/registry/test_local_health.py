"""Local health: a node whose own event loop stalls does not blame its peers, and stretches its timeouts."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from hypothesis import given
from hypothesis import strategies as st
from registry_helpers import converged, swarm, until

from opentela.registry._config import RegistryConfig
from opentela.registry.local_health import LocalHealth, LoopLag


@given(st.integers(0, 16), st.lists(st.booleans(), max_size=200))
def test_the_score_stays_within_its_bounds(limit: int, events: list[bool]) -> None:
    health = LocalHealth(limit)
    for slow in events:
        health.degrade() if slow else health.improve()
        assert 0 <= health.score <= limit
        assert health.multiplier == 1 + health.score


def test_the_score_rises_with_bad_news_and_falls_with_good() -> None:
    health = LocalHealth(3)
    for _ in range(5):
        health.degrade()
    assert health.score == 3
    health.improve()
    assert health.score == 2 and health.multiplier == 3
    assert LocalHealth(0).multiplier == 1


def test_a_stall_counts_for_the_window_it_overlaps() -> None:
    now = [100.0]
    lag = LoopLag(interval=0.25, window=10.0, clock=lambda: now[0])
    lag.record(99.0, 0.8)  # a tick started at 99.0 woke 0.8 s late, at 100.05
    assert lag.worst_since(98.0) == 0.8
    assert lag.worst_since(100.0) == 0.8  # the stall ran past 100.0
    assert lag.worst_since(100.1) == 0.0
    now[0] = 120.0
    lag.record(119.0, 0.0)
    assert lag.worst_since(0.0) == 0.0  # older than the window: forgotten


async def test_the_monitor_sees_a_blocked_loop() -> None:
    lag = LoopLag(interval=0.02, window=5.0)
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.05)
    before = lag.clock()
    time.sleep(0.3)  # noqa: ASYNC251 (block the loop on purpose, as a CPU-starved process would be)
    await asyncio.sleep(0.05)
    assert lag.worst_since(before) >= 0.25
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_probe_that_fails_while_our_loop_stalls_is_no_verdict() -> None:
    # A long probe interval keeps the background rounds out of the way; the probe below is driven by hand.
    config = RegistryConfig(
        anti_entropy_interval=0.2, probe_interval=30.0, probe_timeout=0.2, indirect_timeout=0.3
    )
    async with swarm(3, config) as nodes:
        await until(lambda: converged(nodes))
        prober, victim = nodes[0], nodes[2]
        prober.membership.tick()
        member = prober.membership.swim.members[victim.registry.session_id]
        await victim.aclose()
        probe = asyncio.create_task(prober.membership.probe(member))
        await asyncio.sleep(0)
        time.sleep(0.4)  # noqa: ASYNC251 (our own process stalls while the probe waits)
        assert await probe is False
        stats = prober.membership.stats()
        # (The lost connection also set off an urgent probe, which stalled with us.)
        assert stats["probes_inconclusive"] >= 1 and stats["local_health"] >= 1
        assert not prober.membership.swim.is_suspected(member.session)
        # Once the loop runs on time again, the same silence is a verdict.
        await asyncio.sleep(0.3)
        assert await prober.membership.probe(member) is False
        assert prober.membership.swim.is_suspected(member.session)
        assert prober.membership.stats()["probes_failed"] >= 1


def test_it_can_be_turned_off() -> None:
    config = dataclasses.replace(RegistryConfig(), local_health_limit=0)
    assert LocalHealth(config.local_health_limit).multiplier == 1
