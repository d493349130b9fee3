"""Gossip between real hosts on loopback in one process: push, anti-entropy, and a peer that misbehaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from opentela._types import PROTO_GOSSIP, Lifecycle
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.messages import write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.gossip import Gossip
from opentela.registry.membership import Membership
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry


class Node:
    def __init__(self, host: Host, registry: Registry, membership: Membership, gossip: Gossip) -> None:
        self.host, self.registry, self.membership, self.gossip = host, registry, membership, gossip

    @classmethod
    async def create(cls, config: RegistryConfig) -> Node:
        identity = Identity.generate()
        host = await Host.create(identity, "127.0.0.1:0")
        record = NodeRecord(
            session_id=identity.peer_id[-12:],
            peer_id=identity.peer_id,
            provider_id="p",
            lifecycle=Lifecycle.JOIN,
            version=1,
            addrs=tuple(host.listen_addrs),
        ).signed(identity)
        registry = Registry(identity, record, config=config)
        membership = Membership(host, registry, config=config)
        gossip = Gossip(host, registry, membership, config=config)
        await membership.start()
        await gossip.start()
        return cls(host, registry, membership, gossip)

    async def aclose(self) -> None:
        await self.gossip.aclose()
        await self.membership.aclose()
        await self.host.aclose()


@contextlib.asynccontextmanager
async def swarm(n: int, config: RegistryConfig) -> AsyncIterator[list[Node]]:
    nodes = [await Node.create(config) for _ in range(n)]
    try:
        for node in nodes[1:]:
            await node.host.connect(nodes[0].host.listen_addrs[0])
        yield nodes
    finally:
        await asyncio.gather(*(node.aclose() for node in nodes))


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():  # noqa: ASYNC110 (polling a plain predicate)
            await asyncio.sleep(0.01)


def converged(nodes: list[Node]) -> bool:
    digests = [n.registry.digest() for n in nodes]
    return all(d == digests[0] for d in digests) and len(digests[0]) == len(nodes)


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
        assert sum(n.gossip.stats()["rounds_same"] for n in nodes) > 0, "idle rounds exchange only a hash"


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
