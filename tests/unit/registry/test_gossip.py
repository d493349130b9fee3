"""Gossip between real hosts on loopback in one process: push, anti-entropy, and a peer that misbehaves."""

from __future__ import annotations

import contextlib

import pytest
from registry_helpers import Node, converged, swarm, until

from opentela._types import PROTO_GOSSIP, Lifecycle
from opentela.fabric.identity import Identity
from opentela.fabric.messages import write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.record import ModelEntry, NodeRecord


async def test_new_nodes_learn_the_whole_registry_on_connect() -> None:
    async with swarm(5, RegistryConfig(anti_entropy_interval=60)) as nodes:
        await until(lambda: converged(nodes))


async def test_push_spreads_a_change_without_anti_entropy() -> None:
    async with swarm(5, RegistryConfig(anti_entropy_interval=60, fanout=4)) as nodes:
        await until(lambda: converged(nodes))
        rec = nodes[3].registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: all(n.registry.get(rec.session_id) == rec for n in nodes), timeout=3)
        assert all(n.registry.candidates("m") == [rec] for n in nodes)


async def test_anti_entropy_repairs_without_push() -> None:
    async with swarm(4, RegistryConfig(anti_entropy_interval=0.05, fanout=0)) as nodes:
        await until(lambda: converged(nodes))
        rec = nodes[2].registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: all(n.registry.get(rec.session_id) == rec for n in nodes), timeout=5)
        # Once nothing differs, a round exchanges only the digest (counted as "same"); on a loaded machine the
        # rounds so far may all have carried the change, so wait for an idle one rather than assume it happened.
        await until(lambda: sum(n.gossip.stats()["rounds_same"] for n in nodes) > 0, timeout=5)


async def test_a_peer_sending_garbage_does_not_stop_gossip() -> None:
    async with swarm(3, RegistryConfig(anti_entropy_interval=0.05, fanout=2)) as nodes:
        await until(lambda: converged(nodes))
        for junk in ({"t": "nope"}, {"t": "push", "r": [{"bad": 1}, "x"]}, ["not", "a", "map"]):
            stream = await nodes[1].host.open_stream(nodes[0].host.peer_id, PROTO_GOSSIP)
            await write_msg(stream, junk)
            await stream.write_eof()
            with contextlib.suppress(Exception):
                await stream.read()
            await stream.aclose()
        rec = nodes[2].registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: nodes[0].registry.get(rec.session_id) == rec, timeout=5)
        assert nodes[0].registry.stats()["rejected_malformed"] == 2


async def test_a_push_whose_records_are_not_a_list_is_a_protocol_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with swarm(2, RegistryConfig(anti_entropy_interval=60, fanout=1)) as nodes:
        await until(lambda: converged(nodes))
        before = nodes[0].gossip.stats()["errors"]
        for junk in ({"t": "push", "r": 5}, {"t": "push", "r": {"a": 1}}, {"t": "push", "r": None}):
            stream = await nodes[1].host.open_stream(nodes[0].host.peer_id, PROTO_GOSSIP)
            await write_msg(stream, junk)
            await stream.write_eof()
            with contextlib.suppress(Exception):
                await stream.read()
            await stream.aclose()
        # Counted as gossip errors like any other bad message, never a handler crash with a traceback.
        await until(lambda: nodes[0].gossip.stats()["errors"] >= before + 3, timeout=5)
        assert not [r for r in caplog.records if "failed" in r.getMessage() and r.exc_info]


async def test_disconnect_suspects_at_once_and_a_probe_clears_it() -> None:
    async with swarm(
        2, RegistryConfig(anti_entropy_interval=60, probe_interval=0.05, probe_timeout=0.5)
    ) as nodes:
        a, b = nodes
        await until(lambda: converged(nodes))
        conn = a.host.connection(b.host.peer_id)
        assert conn is not None
        conn.abort()
        await until(
            lambda: a.membership.is_suspected(b.host.peer_id) or not a.host.is_connected(b.host.peer_id)
        )
        # b is alive and reachable at its advertised address: the next probe redials and lifts the suspicion.
        await until(lambda: not a.membership.is_suspected(b.host.peer_id), timeout=5)


@pytest.mark.parametrize("n", [2])
async def test_flush_delivers_a_final_state_before_exit(n: int) -> None:
    async with swarm(n, RegistryConfig(anti_entropy_interval=60, fanout=0)) as nodes:
        await until(lambda: converged(nodes))
        rec = nodes[1].registry.update_local(lifecycle=Lifecycle.DOWN, reason="engine died")
        await nodes[1].gossip.flush(timeout=2)
        await until(lambda: nodes[0].registry.get(rec.session_id) == rec, timeout=2)


async def test_a_joiner_pulls_the_registry_in_parts_from_its_neighbours_not_its_contact() -> None:
    config = RegistryConfig(anti_entropy_interval=60, join_sync_shards=3, join_sync_wait=1.0)
    async with swarm(8, config) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        contact = nodes[0]
        before = {n.host.peer_id: n.gossip.counters["parts_served"] for n in nodes}
        joiner = await Node.create(config)
        try:
            await joiner.join(contact)
            everyone = [*nodes, joiner]
            await until(lambda: converged(everyone), timeout=10)
            served = {
                n.host.peer_id: n.gossip.counters["parts_served"] - before[n.host.peer_id] for n in nodes
            }
            assert served[contact.host.peer_id] == 0  # other neighbours came within the wait
            assert sum(served.values()) >= 2  # the parts came from more than one neighbour
        finally:
            await joiner.aclose()


async def test_anti_entropy_of_a_large_registry_sends_only_the_classes_that_differ() -> None:
    async with swarm(2, RegistryConfig(anti_entropy_interval=0.1, fanout=0)) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        # Enough records (tombstones of sessions that came and went) that a differing round goes by classes.
        extra = []
        for _ in range(100):
            identity = Identity.generate()
            record = NodeRecord(
                session_id=identity.peer_id[-12:],
                peer_id=identity.peer_id,
                provider_id="p",
                lifecycle=Lifecycle.LEFT,
                version=2,
            )
            extra.append(record.signed(identity))
        for node in nodes:
            assert len(node.registry.apply_remote(extra)) == 100
        await until(lambda: nodes[0].registry.digest() == nodes[1].registry.digest())
        rec = nodes[0].registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: nodes[1].registry.get(rec.session_id) == rec, timeout=5)
        assert sum(n.gossip.stats()["rounds_by_shards"] for n in nodes) >= 1
        assert nodes[1].registry.candidates("m") == [rec]
