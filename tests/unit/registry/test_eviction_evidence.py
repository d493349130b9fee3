"""Evictions held for evidence: per-signer limits, quorums, holds that run out; and between real hosts."""

from __future__ import annotations

import asyncio
import dataclasses

from registry_helpers import converged, swarm, until

from opentela._types import Lifecycle
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.evictions import EvictionEvidence, Outcome
from opentela.registry.record import ModelEntry, NodeRecord

OWNER = Identity.generate()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def eviction(signer: Identity, session: str = "s1", version: int = 2) -> NodeRecord:
    live = NodeRecord(session, OWNER.peer_id, "lab", Lifecycle.SERVING, version - 1, updated_at=1.0)
    return dataclasses.replace(live, lifecycle=Lifecycle.LEFT, version=version, reason="suspected").signed(
        signer
    )


def evidence(clock: Clock, **overrides: float) -> EvictionEvidence:
    settings = {"quorum": 3, "hold": 30.0, "signer_limit": 2, "signer_window": 60.0, **overrides}
    return EvictionEvidence(clock=clock, **settings)  # type: ignore[arg-type]


def test_distinct_signers_make_a_quorum_and_copies_count_once() -> None:
    ev = evidence(Clock())
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    first = eviction(a)
    assert ev.hold(first) is Outcome.HELD and ev.hold(first) is Outcome.KNOWN
    assert ev.hold(eviction(a, version=3)) is Outcome.UPDATED  # one signer, however many versions
    assert ev.hold(eviction(b)) is Outcome.HELD and not ev.has_quorum("s1")
    assert ev.hold(eviction(c)) is Outcome.HELD and ev.has_quorum("s1")
    assert ev.signers("s1") == {a.peer_id, b.peer_id, c.peer_id}
    assert len(ev.take("s1")) == 3 and ev.sessions() == []


def test_a_signer_over_its_limit_is_dropped_until_its_window_passes() -> None:
    clock = Clock()
    ev = evidence(clock)
    mallory = Identity.generate()
    assert ev.hold(eviction(mallory, "s1")) is Outcome.HELD
    assert ev.hold(eviction(mallory, "s2")) is Outcome.HELD
    assert ev.hold(eviction(mallory, "s3")) is Outcome.RATE_LIMITED
    clock.now += 61
    assert ev.hold(eviction(mallory, "s3")) is Outcome.HELD


def test_a_hold_runs_out_and_the_refused_copy_is_ignored_for_a_while() -> None:
    clock = Clock()
    ev = evidence(clock)
    record = eviction(Identity.generate())
    ev.hold(record)
    clock.now += 10
    assert ev.expire() == [] and len(ev) == 1
    clock.now += 25
    assert ev.expire() == [record] and len(ev) == 0
    assert ev.hold(record) is Outcome.KNOWN  # re-sent by anti-entropy: not examined again
    clock.now += 31
    ev.expire()
    assert ev.hold(record) is Outcome.HELD


FAST = RegistryConfig(
    anti_entropy_interval=0.2,
    probe_interval=0.05,
    probe_timeout=0.2,
    indirect_timeout=0.3,
    suspicion_timeout=0.6,
)


async def test_a_members_eviction_of_a_reachable_node_is_held_not_merged() -> None:
    async with swarm(3, dataclasses.replace(FAST, suspicion_timeout=30.0)) as nodes:
        await until(lambda: converged(nodes))
        evictor, witness, victim = nodes
        session = victim.registry.update_local(
            lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),)
        ).session_id
        await until(lambda: converged(nodes))
        assert evictor.registry.evict(session, "forged") is not None
        await until(lambda: witness.membership.stats()["evictions_unconfirmed"] >= 1)
        await until(lambda: victim.membership.stats()["evictions_unconfirmed"] >= 1)
        await asyncio.sleep(1.0)
        assert witness.registry.get(session).lifecycle is Lifecycle.SERVING
        assert victim.registry.session_id == session and victim.registry.local.lifecycle is Lifecycle.SERVING
        assert witness.membership.stats()["evictions_confirmed"] == 0


async def test_an_eviction_of_a_dead_node_still_merges_everywhere() -> None:
    # quorum 3 cannot be met by one evictor: the others merge on their own failed probes.
    async with swarm(4, FAST) as nodes:
        await until(lambda: converged(nodes))
        victim = nodes[3]
        session = victim.registry.update_local(lifecycle=Lifecycle.SERVING).session_id
        await until(lambda: converged(nodes))
        await victim.aclose()
        survivors = nodes[:3]
        await until(lambda: all(n.registry.get(session).lifecycle is Lifecycle.LEFT for n in survivors), 10)
        assert len({n.registry.get(session).signature for n in survivors}) >= 1


async def test_a_node_that_knows_few_records_still_holds_one_members_eviction_of_itself() -> None:
    # A joiner in its first sync holds few records; the peers it is connected to count towards the quorum
    # for its own eviction all the same, or one member could evict any node in its first second.
    config = dataclasses.replace(FAST, suspicion_timeout=30.0, active_view=0)
    async with swarm(2, config) as (victim, evictor):
        await until(lambda: converged([victim, evictor]))
        bystander = await Host.create(Identity.generate(), "127.0.0.1:0")
        try:
            await bystander.connect(victim.host.listen_addrs[0])
            await until(lambda: bystander.peer_id in victim.host.connected_peers())
            session = victim.registry.session_id
            assert evictor.registry.evict(session, "forged") is not None
            await until(lambda: victim.membership.stats()["evictions_unconfirmed"] >= 1)
            await asyncio.sleep(0.5)
            assert victim.registry.session_id == session
            assert victim.registry.local.lifecycle is not Lifecycle.LEFT
            assert victim.registry.counters["evicted"] == 0
        finally:
            await bystander.aclose()
