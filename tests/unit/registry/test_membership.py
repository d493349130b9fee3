"""SWIM between real hosts on loopback: a dead node is evicted, a slow one refutes, forged records go nowhere."""

from __future__ import annotations

import asyncio
import dataclasses

from registry_helpers import Node, converged, swarm, until

from opentela._types import PROTO_GOSSIP, PROTO_PROBE, Lifecycle, Stream
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.messages import write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.record import ModelEntry, NodeRecord

FAST = RegistryConfig(
    anti_entropy_interval=0.2,
    probe_interval=0.05,
    probe_timeout=0.2,
    indirect_timeout=0.3,
    suspicion_timeout=0.6,
)


def serve(node: Node) -> NodeRecord:
    return node.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))


def record_at(node: Node, session: str) -> NodeRecord | None:
    return node.registry.get(session)


async def test_a_dead_node_is_suspected_then_evicted_and_everyone_agrees() -> None:
    async with swarm(4, FAST) as nodes:
        await until(lambda: converged(nodes))
        victim = nodes[3]
        session = serve(victim).session_id
        survivors = nodes[:3]
        await until(lambda: all(n.registry.candidates("m") for n in survivors))
        await victim.aclose()
        await until(lambda: all(n.membership.is_suspected(victim.host.peer_id) for n in survivors))
        await until(
            lambda: all(record_at(n, session).lifecycle is Lifecycle.LEFT for n in survivors), timeout=10
        )
        # Concurrent evictions by several witnesses merge to one record everywhere.
        await until(lambda: len({record_at(n, session).signature for n in survivors}) == 1)
        eviction = record_at(survivors[0], session)
        assert eviction.signer in {n.host.peer_id for n in survivors} and "SWIM" in eviction.reason
        assert all(n.registry.candidates("m") == [] for n in survivors)
        assert sum(n.membership.stats()["evictions"] for n in survivors) >= 1
        await until(lambda: all(session not in n.membership.swim.members for n in survivors))


async def test_the_witness_evicts_when_the_grace_ends_not_at_its_next_protocol_period() -> None:
    # No protocol period runs within this test (30 s apart): the eviction can only come from the grace's end.
    config = dataclasses.replace(FAST, probe_interval=30.0, suspicion_timeout=1.0)
    async with swarm(3, config) as nodes:
        await until(lambda: converged(nodes))
        witness, _, victim = nodes
        for node in nodes:
            node.membership.tick()  # the members follow the registry (a period's first step)
        session = victim.registry.session_id
        member = witness.membership.swim.members[session]
        await victim.aclose()
        assert not await witness.membership.probe(member)
        assert witness.membership.swim.is_suspected(session)
        await until(lambda: record_at(witness, session).lifecycle is Lifecycle.LEFT, timeout=5)
        assert witness.membership.stats()["evictions"] == 1


async def test_a_slow_node_refutes_and_keeps_its_session() -> None:
    config = dataclasses.replace(FAST, suspicion_timeout=30.0)
    async with swarm(4, config) as nodes:
        await until(lambda: converged(nodes))
        slow = nodes[1]
        record = serve(slow)
        others = [n for n in nodes if n is not slow]
        await until(lambda: all(n.registry.candidates("m") for n in others))
        resume = asyncio.Event()
        answer = slow.membership.rpc_probe

        async def stalled(stream: Stream) -> None:
            await resume.wait()
            await answer(stream)

        slow.host.set_handler(PROTO_PROBE, stalled)
        await until(
            lambda: all(n.membership.swim.is_suspected(record.session_id) for n in others), timeout=10
        )
        assert all(not any(r.session_id == record.session_id for r in n_candidates(n)) for n in others)
        slow.host.set_handler(PROTO_PROBE, answer)
        resume.set()
        await until(
            lambda: not any(n.membership.swim.is_suspected(record.session_id) for n in others), timeout=10
        )
        assert slow.membership.swim.incarnation >= 1 and slow.membership.stats()["refutations"] >= 1
        assert all(record_at(n, record.session_id) == record for n in nodes), "same session, still SERVING"
        assert all(n_candidates(n) for n in others)


def n_candidates(node: Node) -> list[NodeRecord]:
    """What the gateway on `node` would route to."""
    return [r for r in node.registry.candidates("m") if not node.membership.is_excluded(r)]


async def push(attacker: Host, target: Node, records: list[NodeRecord]) -> None:
    stream = await attacker.open_stream(target.host.peer_id, PROTO_GOSSIP, addrs=target.host.listen_addrs)
    await write_msg(stream, {"t": "push", "r": [r.to_wire() for r in records]})
    await stream.write_eof()
    await stream.aclose()


async def test_forged_records_pushed_over_gossip_never_reach_any_view() -> None:
    async with swarm(3, FAST) as nodes:
        await until(lambda: converged(nodes))
        honest = nodes[2]
        good = serve(honest)
        await until(lambda: all(n.registry.get(good.session_id) == good for n in nodes))
        mallory = Identity.generate()
        forged = [
            dataclasses.replace(good, models=(ModelEntry("evil"),), version=9),  # tampered after signing
            dataclasses.replace(good, version=9, models=(ModelEntry("evil"),)).signed(mallory),  # another key
            good.tombstone(version=9, reason="gone").signed(mallory),
            dataclasses.replace(  # an eviction in a member's name without its signature
                good.tombstone(),
                version=9,
                reason="gone",
                signer=nodes[0].host.peer_id,
                signature=bytes(64),
            ),
            dataclasses.replace(good, session_id="fake", models=(ModelEntry("evil"),)).signed(mallory),
        ]
        attacker = await Host.create(mallory, "127.0.0.1:0")
        try:
            for target in nodes[:2]:
                await push(attacker, target, forged)
            await until(lambda: sum(_rejected(n) for n in nodes[:2]) >= 2 * len(forged), timeout=5)
            rounds = sum(n.gossip.stats()["rounds"] for n in nodes)
            await until(lambda: sum(n.gossip.stats()["rounds"] for n in nodes) >= rounds + 6, timeout=10)
        finally:
            await attacker.aclose()
        for node in nodes:
            assert node.registry.get(good.session_id) == good
            assert node.registry.get("fake") is None
            assert node.registry.candidates("m") == [good] and node.registry.candidates("evil") == []
            assert "evil" not in node.registry.known_models()


def _rejected(node: Node) -> int:
    stats = node.registry.stats()
    return stats.get("rejected_bad_signature", 0) + stats.get("rejected_not_member", 0)


async def test_a_node_that_hears_from_nobody_does_not_evict_anyone() -> None:
    async with swarm(3, FAST) as nodes:
        await until(lambda: converged(nodes))
        alone, *gone = nodes
        sessions = [n.registry.session_id for n in gone]
        for node in gone:
            await node.aclose()
        await until(lambda: all(alone.membership.swim.is_suspected(s) for s in sessions), timeout=10)
        await until(lambda: alone.membership.stats()["evictions_held"] >= 2, timeout=10)
        assert all(alone.registry.get(s).lifecycle is Lifecycle.JOIN for s in sessions)
        assert all(alone.membership.is_suspected(n.host.peer_id) for n in gone), "still out of routing"


async def test_junk_on_the_probe_protocol_is_ignored() -> None:
    async with swarm(2, FAST) as nodes:
        await until(lambda: converged(nodes))
        a, b = nodes
        await until(lambda: a.registry.session_id in b.membership.swim.members)
        await until(lambda: b.registry.session_id in a.membership.swim.members)
        for junk in (
            ["x"],
            {"u": [[9, "s", 1], "junk", [1, "", 0]]},
            {"r": 5},
            {"p": b.registry.session_id, "u": 3},
        ):
            stream = await a.host.open_stream(b.host.peer_id, PROTO_PROBE)
            await write_msg(stream, junk)
            await stream.write_eof()
            await stream.read()
            await stream.aclose()
        assert b.membership.swim.incarnation == 0
        member = b.membership.swim.members[a.registry.session_id]
        assert await a.membership.call_ping(a.membership.swim.members[b.registry.session_id]) == 0
        assert member.status.name == "ALIVE"
