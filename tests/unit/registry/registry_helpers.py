"""Registry nodes in one process over real loopback sockets: host, registry, partial view, SWIM and gossip."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from opentela._types import Lifecycle
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.gossip import Gossip
from opentela.registry.membership import Membership
from opentela.registry.overlay import Overlay
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry


class Node:
    """One registry node: a real host, its replica, overlay, SWIM and gossip; `aclose` twice is fine (a "dead" node)."""

    def __init__(
        self,
        host: Host,
        registry: Registry,
        membership: Membership,
        gossip: Gossip,
        overlay: Overlay | None = None,
    ) -> None:
        self.host, self.registry, self.membership, self.gossip = host, registry, membership, gossip
        self.overlay = overlay
        self.identity = registry.identity
        self.closed = False

    @classmethod
    async def create(cls, config: RegistryConfig, gossip_class: type[Gossip] = Gossip) -> Node:
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
        overlay = Overlay(host, registry, config=config) if config.active_view > 0 else None
        membership = Membership(host, registry, config=config, overlay=overlay)
        gossip = gossip_class(host, registry, membership, config=config, overlay=overlay)
        await membership.start()
        await gossip.start()
        if overlay is not None:
            await overlay.start()
        return cls(host, registry, membership, gossip, overlay)

    async def join(self, contact: Node) -> None:
        """Connect to `contact` and, with a partial view, join the overlay through it."""
        await self.host.connect(contact.host.listen_addrs[0])
        if self.overlay is not None:
            self.overlay.join(contact.host.peer_id, tuple(contact.host.listen_addrs))

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.gossip.aclose()
        await self.membership.aclose()
        if self.overlay is not None:
            await self.overlay.aclose()
        await self.host.aclose()


@contextlib.asynccontextmanager
async def swarm(n: int, config: RegistryConfig) -> AsyncIterator[list[Node]]:
    nodes = [await Node.create(config) for _ in range(n)]
    try:
        for node in nodes[1:]:
            await node.join(nodes[0])
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
