"""How peers reach this node: the addresses it advertises, a dial-back check, and relay slots when private."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentela._types import PeerId
from opentela.errors import OpenTelaError
from opentela.fabric.addresses import format_addr, parse_addr
from opentela.fabric.relay import circuit_addr
from opentela.node._config import Reachability

logger = logging.getLogger(__name__)


class ReachabilityHost(Protocol):
    """What the fabric host does for reachability: ask a peer to dial us back, and hold a relay slot."""

    async def check_reachable(self, peer_id: PeerId, addrs: Sequence[str]) -> list[str]: ...

    async def reserve_relay(self, relay_addr: str) -> PeerId: ...


def advertised_addrs(listen_addrs: list[str], configured: tuple[str, ...]) -> tuple[str, ...]:
    """What peers should dial: the configured addresses, else the bound ones with wildcards made concrete."""
    if configured:
        return configured
    out: list[str] = []
    for addr in listen_addrs:
        host, port, _ = parse_addr(addr)
        if host in ("0.0.0.0", "::", ""):
            ips = {"127.0.0.1"}
            with contextlib.suppress(OSError):
                ips.update(
                    str(info[4][0])
                    for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
                    if not str(info[4][0]).startswith("127.")
                )
            # Routable addresses first: peers try them in order.
            out.extend(f"{ip}:{port}" for ip in sorted(ips, key=lambda ip: ip.startswith("127.")))
        else:
            out.append(f"{host}:{port}")
    return tuple(out)


class NodeReachability:
    """Decides what this node advertises: its own addresses, or circuit addresses through relays.

    `public` advertises the node's addresses; `private` advertises nothing until it holds relay slots on the
    bootstrap peers; `auto` advertises its addresses, has a bootstrap peer dial them back, and turns private
    if none gets through. Changes go to the node's record through `update_record` (registry.update_local).
    """

    def __init__(
        self,
        mode: Reachability,
        host: ReachabilityHost,
        bootstrap: Sequence[str],
        update_record: Callable[..., Any],
    ) -> None:
        self.mode = mode
        self.host = host
        self.bootstrap = tuple(bootstrap)
        self._update = update_record
        self.found_private = False
        self.relays: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<NodeReachability {self.mode.value} private={self.private} relays={len(self.relays)}>"

    @property
    def private(self) -> bool:
        """Whether this node accepts no inbound connections and must be reached through relays."""
        return self.mode == Reachability.PRIVATE or self.found_private

    def initial_addrs(self, listen_addrs: list[str], configured: tuple[str, ...]) -> tuple[str, ...]:
        """The addresses of the first record: none for a private node until it holds relay slots."""
        return () if self.mode == Reachability.PRIVATE else advertised_addrs(listen_addrs, configured)

    async def settle(self, peers: list[PeerId], addrs: Sequence[str]) -> None:
        """After bootstrapping through `peers`: check `addrs` from outside (auto), then take relays if private."""
        if self.mode == Reachability.AUTO and peers:
            await self.detect(peers, addrs)
        if self.private:
            await self.reserve_relays()

    async def detect(self, peers: list[PeerId], addrs: Sequence[str]) -> None:
        """Ask a bootstrap peer to dial our advertised addresses; if none answers, behave as a private node.

        A peer dials back only addresses it can tell are ours (fabric/relay.py) and only a few times a minute;
        one that refuses, or cannot check any of them, gives no verdict and the next peer is asked.
        """
        addrs = list(addrs)
        for peer in peers:
            try:
                reachable = await self.host.check_reachable(peer, addrs)
            except OpenTelaError as exc:
                logger.info("reachability check through %s failed: %s", peer[-8:], exc)
                continue
            if reachable:
                logger.info("reachable from outside", extra={"addrs": ",".join(reachable)})
                if set(reachable) != set(addrs):
                    self._update(addrs=tuple(a for a in addrs if a in reachable))
            else:
                logger.warning("no inbound connection reaches this node: switching to relays")
                self.found_private = True
            return

    async def reserve_relays(self) -> None:
        """Hold relay slots on the bootstrap peers and advertise circuit addresses instead of our own."""
        relays: list[str] = []
        for addr in self.bootstrap:
            try:
                relay_peer = await self.host.reserve_relay(addr)
            except (OpenTelaError, ValueError) as exc:
                logger.warning("no relay slot at %s: %s", addr, exc)
                continue
            host, port, _ = parse_addr(addr)
            relays.append(f"{relay_peer}@{format_addr(host, port)}")
        if not relays:
            logger.error(
                "private node without any relay: peers cannot reach it until a bootstrap peer relays"
            )
            return
        self.relays = tuple(relays)
        self._update(addrs=tuple(circuit_addr(r) for r in relays), relays=self.relays)
        logger.info("reachable through relays", extra={"relays": ",".join(relays)})
