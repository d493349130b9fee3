"""Lazy push between real hosts on loopback: a prune, ids instead of records, a graft, and an older node."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from registry_helpers import Node, converged, swarm, until

from opentela._types import PROTO_GOSSIP, Lifecycle, PeerId, Stream
from opentela.fabric.messages import write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.gossip import Gossip, _pushed
from opentela.registry.lazy_push import GRAFT_TIMEOUT
from opentela.registry.record import ModelEntry


async def test_a_duplicate_prunes_the_link_and_a_missing_record_is_grafted() -> None:
    async with swarm(2, RegistryConfig(anti_entropy_interval=60)) as nodes:
        a, b = nodes
        await until(lambda: converged(nodes), timeout=10)
        a_id, b_id = a.host.peer_id, b.host.peer_id
        assert a.gossip.lazy is not None and b.gossip.lazy is not None
        # b's first sync (a part pulled from a, its contact) told each that the other understands ids.
        await until(lambda: a_id in b.gossip.lazy.capable and b_id in a.gossip.lazy.capable)
        # a serves (SERVING records are the ones that go along the tree), then pushes b that record again: b
        # prunes the link, and a sends it ids from now on.
        serving = a.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m0"),))
        await until(lambda: b.registry.get(serving.session_id) == serving)
        assert await a.gossip._push_to(b_id, b.host.listen_addrs, [serving])
        await until(lambda: a.gossip.lazy.is_lazy(b_id) if a.gossip.lazy else False)
        assert b.gossip.stats()["prunes_sent"] == 1
        # a's next change reaches b as an id only; b waits for the record, then grafts it from a.
        rec = a.registry.update_local(models=(ModelEntry("m"),))
        await until(lambda: b.registry.get(rec.session_id) == rec, timeout=GRAFT_TIMEOUT + 5)
        assert a.gossip.stats()["ids_sent"] >= 1
        assert b.gossip.stats()["grafts_sent"] >= 1 and a.gossip.stats()["grafts_served"] >= 1
        assert not a.gossip.lazy.is_lazy(b_id)  # the graft made the link eager again
        assert b.registry.candidates("m") == [rec]


async def test_losing_a_tree_link_asks_the_lazy_neighbours_for_records_again() -> None:
    async with swarm(3, RegistryConfig(anti_entropy_interval=60)) as nodes:
        a, b, _ = nodes
        await until(lambda: converged(nodes), timeout=10)
        a_id, b_id, c_id = (n.host.peer_id for n in nodes)
        assert a.gossip.lazy is not None and b.gossip.lazy is not None
        await until(lambda: b_id in a.gossip.lazy.capable and a_id in b.gossip.lazy.capable)
        # Make a-b a lazy link at both ends (a duplicate push, then b's prune), as a tree leaves most links.
        serving = a.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m0"),))
        await until(lambda: b.registry.get(serving.session_id) == serving)
        assert await a.gossip._push_to(b_id, b.host.listen_addrs, [serving])
        await until(lambda: a.gossip.lazy.is_lazy(b_id) and b.gossip.lazy.is_lazy(a_id))
        assert not a.gossip.lazy.is_lazy(c_id)
        # a's eager neighbour c leaves its active view: a pushes records to b again, and asks b to do the same.
        a.gossip._on_neighbour_down(c_id)
        assert not a.gossip.lazy.is_lazy(b_id) and a.gossip.stats()["reeagered"] == 1
        await until(lambda: not b.gossip.lazy.is_lazy(a_id))
        assert b.gossip.stats()["grafts_served"] == 1 and a.gossip.stats().get("grafts_sent", 0) == 0
        # b's next change reaches a without a graft.
        rec = b.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m1"),))
        await until(lambda: a.registry.get(rec.session_id) == rec, timeout=GRAFT_TIMEOUT / 2)
        await asyncio.sleep(GRAFT_TIMEOUT)
        assert a.gossip.stats().get("grafts_sent", 0) == 0


class OlderGossip(Gossip):
    """A node from before lazy push: it never says it understands ids, takes only the records of a push, and
    floods (it never prunes)."""

    foreign: int = 0  # push messages with ids or a prune in them

    async def _send(self, stream: Stream, obj: dict[str, Any]) -> None:
        await super()._send(stream, {k: v for k, v in obj.items() if k != "l"})

    def _on_push(self, peer: PeerId, msg: dict[str, Any]) -> None:
        if "i" in msg or "x" in msg:
            self.foreign += 1
        self._apply_from(peer, _pushed(msg))


async def test_an_older_node_gets_every_record_and_is_never_sent_ids() -> None:
    config = RegistryConfig(anti_entropy_interval=0.3)
    async with swarm(5, config) as nodes:
        await until(lambda: converged(nodes), timeout=10)
        older = await Node.create(config, gossip_class=OlderGossip)
        try:
            await older.join(nodes[0])
            everyone = [*nodes, older]
            await until(lambda: converged(everyone), timeout=10)
            await asyncio.sleep(1.0)  # a few anti-entropy rounds: the new nodes learn about one another
            for i, writer in enumerate([*everyone, *everyone]):
                # SERVING versions: they are what goes along the tree (JOIN records are flooded).
                rec = writer.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry(f"m{i}"),))
                await until(
                    lambda r=rec: all(n.registry.get(r.session_id) == r for n in everyone), timeout=10
                )
            assert isinstance(older.gossip, OlderGossip) and older.gossip.foreign == 0
            lazies = 0
            for node in nodes:
                lazy = node.gossip.lazy
                assert lazy is not None and older.host.peer_id not in lazy.capable
                lazies += len(lazy.lazy)
            assert lazies > 0, "the new nodes pruned none of their links"
        finally:
            await older.aclose()


async def test_malformed_ids_and_grafts_are_protocol_errors() -> None:
    async with swarm(2, RegistryConfig(anti_entropy_interval=60)) as nodes:
        a, b = nodes
        await until(lambda: converged(nodes), timeout=10)
        before = a.gossip.stats()["errors"]
        junk: list[dict[str, Any]] = [
            {"t": "push", "i": "nope"},
            {"t": "push", "i": [["k", 1]]},
            {"t": "push", "i": [["k", -1, 2]]},
            {"t": "push", "i": [["k", 1, True]]},
            {"t": "graft", "k": "nope"},
            {"t": "graft", "k": ["k"] * 5000},
        ]
        for msg in junk:
            stream = await b.host.open_stream(a.host.peer_id, PROTO_GOSSIP)
            await write_msg(stream, msg)
            await stream.write_eof()
            with contextlib.suppress(Exception):
                await stream.read()
            await stream.aclose()
        await until(lambda: a.gossip.stats()["errors"] >= before + len(junk), timeout=5)
        assert a.gossip.stats()["waiting_for"] == 0
        # Gossip goes on.
        rec = b.registry.update_local(lifecycle=Lifecycle.SERVING, models=(ModelEntry("m"),))
        await until(lambda: a.registry.get(rec.session_id) == rec, timeout=5)
