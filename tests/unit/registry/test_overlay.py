"""Partial views between real hosts on loopback: small symmetric views, flooding, evictions, junk on the wire."""

from __future__ import annotations

import asyncio
import dataclasses

from registry_helpers import Node, converged, swarm, until

from opentela._types import PROTO_VIEW, Lifecycle
from opentela.fabric.messages import read_msg, write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.record import ModelEntry

SMALL = RegistryConfig(
    active_view=2,
    passive_view=4,
    active_walk=3,
    passive_walk=1,
    shuffle_interval=0.3,
    anti_entropy_interval=0.2,
    passive_anti_entropy=0.3,
    probe_interval=0.05,
    probe_timeout=0.2,
    indirect_timeout=0.3,
    suspicion_timeout=0.6,
)


def symmetric(nodes: list[Node]) -> bool:
    by_peer = {n.host.peer_id: n for n in nodes if not n.closed}
    for node in by_peer.values():
        assert node.overlay is not None
        for peer in node.overlay.active():
            other = by_peer.get(peer)
            if other is None or other.overlay is None or node.host.peer_id not in other.overlay.active():
                return False
    return True


async def test_views_stay_small_and_symmetric_and_a_change_reaches_everyone() -> None:
    async with swarm(7, SMALL) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        await until(lambda: symmetric(nodes), timeout=10)
        for node in nodes:
            assert node.overlay is not None and 1 <= len(node.overlay.active()) <= 2
            assert len(node.membership.watched() or ()) <= 2, "SWIM probes neighbours only"
        rec = nodes[4].registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: all(n.registry.get(rec.session_id) == rec for n in nodes), timeout=10)


async def test_a_dead_node_is_evicted_by_its_neighbours_and_merged_everywhere() -> None:
    async with swarm(7, SMALL) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        await until(lambda: symmetric(nodes), timeout=10)
        victim = nodes[5]
        session = victim.registry.session_id
        neighbours = set(victim.overlay.active()) if victim.overlay else set()
        await victim.aclose()
        survivors = [n for n in nodes if n is not victim]
        await until(
            lambda: all(n.registry.get(session).lifecycle is Lifecycle.LEFT for n in survivors), timeout=15
        )
        # Two neighbours may write the eviction at once; the copies then cross the mesh, so the
        # survivors agree on one winner a round later, not at the moment each sees LEFT.
        await until(lambda: len({n.registry.get(session).signer for n in survivors}) == 1, timeout=10)
        witnesses = {n.host.peer_id for n in survivors if n.membership.stats()["evictions"]}
        assert witnesses & neighbours, "its neighbours witnessed the failure and wrote the eviction"
        assert sum(n.membership.stats()["evictions_refused"] for n in survivors) == 0
        await until(
            lambda: all(
                n.overlay is not None and victim.host.peer_id not in n.overlay.active() for n in survivors
            ),
            timeout=10,
        )


async def test_one_member_cannot_evict_a_node_the_others_reach() -> None:
    config = dataclasses.replace(SMALL, eviction_hold=1.0)
    async with swarm(5, config) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        rogue, target = nodes[1], nodes[3]
        session = target.registry.session_id
        eviction = rogue.registry.evict(session, "made up")
        assert eviction is not None
        await asyncio.sleep(2.5)  # past the hold: everyone who got it probed the target and refused it
        others = [n for n in nodes if n is not rogue]
        assert all(n.registry.get(session).lifecycle is Lifecycle.JOIN for n in others)
        assert sum(n.membership.stats()["evictions_refused"] for n in others) >= 1, "held, then refused"


async def test_a_short_lived_connection_starts_no_anti_entropy() -> None:
    async with swarm(5, SMALL) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        quiet = dataclasses.replace(SMALL, anti_entropy_interval=60, shuffle_interval=60)
        for node in nodes:
            node.gossip.config = quiet  # no periodic rounds from here on: only a hello would count one
        await asyncio.sleep(1.0)
        a = nodes[1]
        assert a.overlay is not None
        strangers = [n for n in nodes if n is not a and n.host.peer_id not in a.overlay.active()]
        assert strangers, "with views of two, five nodes are not all neighbours"
        b = strangers[0]
        if (conn := a.host.connection(b.host.peer_id)) is not None:
            conn.abort()  # a connection left from an earlier request: the ping below must open a new one
            await until(lambda: not a.host.is_connected(b.host.peer_id))
        member = a.membership.swim.members[b.registry.session_id]
        rounds = sum(n.gossip.stats()["rounds"] for n in nodes)
        assert await a.membership.call_ping(member) == 0
        assert a.host.is_connected(b.host.peer_id)
        await asyncio.sleep(0.5)
        assert sum(n.gossip.stats()["rounds"] for n in nodes) == rounds


async def test_junk_on_the_view_protocol_is_counted_and_ignored() -> None:
    async with swarm(2, SMALL) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        a, b = nodes
        assert b.overlay is not None
        before = b.overlay.stats()["malformed"]
        for junk in (
            ["x"],
            {"m": "no"},
            {"m": [{"t": "nope"}, {"t": "shuffle", "p": "not a peer id"}, {"t": "neighbor", "ttl": -1}]},
            {"m": [{"t": "forward_join", "p": a.host.peer_id, "ttl": 99}]},
        ):
            stream = await a.host.open_stream(b.host.peer_id, PROTO_VIEW)
            await write_msg(stream, junk)
            await stream.write_eof()
            try:
                await read_msg(stream)
            except Exception:  # the answer to junk may be nothing at all
                pass
            await stream.aclose()
        await until(lambda: b.overlay is not None and b.overlay.stats()["malformed"] >= before + 6)
        assert b.overlay.active() == (a.host.peer_id,)
