"""Liveness as this node sees it: suspected peers are excluded from routing; nothing here enters the CRDT.

`LivenessView` is the pure state machine; `Membership` drives it from the fabric (disconnects, probe results,
contact). The full SWIM protocol (indirect probes, incarnations, eviction) grows out of this seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentela._types import PROTO_PROBE, Lifecycle, PeerId, Stream
from opentela.errors import OpenTelaError
from opentela.fabric.host import Host
from opentela.fabric.messages import read_msg, write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Suspicion:
    """Why and since when a peer is suspected."""

    since: float
    reason: str


class LivenessView:
    """suspected peers and when each was last heard from; pure, clock passed in."""

    def __init__(self) -> None:
        self.suspected: dict[PeerId, Suspicion] = {}
        self.last_seen: dict[PeerId, float] = {}
        self._listeners: list[Callable[[PeerId, bool], None]] = []

    def on_change(self, listener: Callable[[PeerId, bool], None]) -> None:
        """Called with (peer, suspected) on each transition."""
        self._listeners.append(listener)

    def suspect(self, peer: PeerId, reason: str, now: float) -> bool:
        """Mark `peer` suspected; True when it was not already."""
        if peer in self.suspected:
            return False
        self.suspected[peer] = Suspicion(now, reason)
        for listener in self._listeners:
            listener(peer, True)
        return True

    def alive(self, peer: PeerId, now: float) -> bool:
        """Record contact with `peer`; True when this lifts a suspicion."""
        self.last_seen[peer] = now
        if self.suspected.pop(peer, None) is None:
            return False
        for listener in self._listeners:
            listener(peer, False)
        return True

    def is_suspected(self, peer: PeerId) -> bool:
        """Whether routing should avoid `peer`."""
        return peer in self.suspected


class Membership:
    """Feeds the liveness view from connection events and periodic ping probes over /otela/probe/1."""

    def __init__(self, host: Host, registry: Registry, *, config: RegistryConfig | None = None) -> None:
        self.host = host
        self.registry = registry
        self.config = config or RegistryConfig()
        self.view = LivenessView()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rng = random.Random()
        self.probes_sent = 0
        self.probes_failed = 0

    def __repr__(self) -> str:
        return f"<Membership suspected={len(self.view.suspected)}>"

    async def start(self) -> None:
        """Serve probes, watch connections, start probing."""
        self.host.set_handler(PROTO_PROBE, self.rpc_ping)
        self.host.on_peer_disconnected(lambda peer: self.suspect(peer, "connection lost"))
        self.host.on_peer_connected(self.confirm_alive)
        self.view.on_change(self._log_change)
        task = asyncio.create_task(self._probe_loop(), name="otela-probe-loop")
        self._tasks.add(task)

    async def aclose(self) -> None:
        """Stop probing."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    @staticmethod
    def _log_change(peer: PeerId, suspected: bool) -> None:
        if suspected:
            logger.info("peer suspected", extra={"peer_id": peer})
        else:
            logger.info("peer alive again", extra={"peer_id": peer})

    def suspect(self, peer: PeerId, reason: str) -> None:
        """Exclude `peer` from routing until it answers again."""
        if peer != self.host.peer_id:
            self.view.suspect(peer, reason, time.monotonic())

    def confirm_alive(self, peer: PeerId) -> None:
        """We heard from `peer`."""
        self.view.alive(peer, time.monotonic())

    def is_suspected(self, peer: PeerId) -> bool:
        """Local verdict for routing."""
        return peer in self.view.suspected

    def _addrs_of(self, peer: PeerId) -> tuple[str, ...]:
        for record in self.registry.records():
            if record.peer_id == peer and record.lifecycle <= Lifecycle.SERVING:
                return record.addrs
        return ()

    def probe_targets(self) -> list[PeerId]:
        """Peers worth probing: live records of others, plus anyone connected."""
        me = self.host.peer_id
        peers = {
            r.peer_id for r in self.registry.records() if r.lifecycle <= Lifecycle.SERVING and r.peer_id != me
        }
        peers.update(self.host.connected_peers())
        return sorted(peers)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval * (0.5 + self._rng.random()))
            targets = self.probe_targets()
            if not targets:
                continue
            # One random peer per round, plus every suspected one so a recovered peer comes back promptly.
            chosen = {self._rng.choice(targets)} | (set(self.view.suspected) & set(targets))
            await asyncio.gather(*(self.probe(p) for p in chosen))

    async def probe(self, peer: PeerId) -> bool:
        """Ping `peer` once; updates the view; True when it answered in time."""
        self.probes_sent += 1
        nonce = int.from_bytes(os.urandom(8), "big")
        try:
            async with asyncio.timeout(self.config.probe_timeout):
                stream = await self.host.open_stream(
                    peer, PROTO_PROBE, addrs=self._addrs_of(peer), timeout=self.config.probe_timeout
                )
                try:
                    await write_msg(stream, {"ping": nonce})
                    reply = await read_msg(stream, 1024)
                finally:
                    await stream.aclose()
            ok = isinstance(reply, dict) and reply.get("pong") == nonce
        except (OpenTelaError, TimeoutError, asyncio.IncompleteReadError, OSError):
            ok = False
        if ok:
            self.confirm_alive(peer)
        else:
            self.probes_failed += 1
            self.suspect(peer, "probe failed")
        return ok

    async def rpc_ping(self, stream: Stream) -> None:
        """Answer a probe."""
        self.confirm_alive(stream.remote_peer)
        with contextlib.suppress(OpenTelaError, asyncio.IncompleteReadError):
            msg = await read_msg(stream, 1024)
            if isinstance(msg, dict) and "ping" in msg:
                await write_msg(stream, {"pong": msg["ping"]})
        await stream.aclose()

    def snapshot(self) -> list[dict[str, Any]]:
        """Known peers, connected or not, with their liveness."""
        now = time.monotonic()
        out = []
        connected = set(self.host.connected_peers())
        for peer in sorted(set(self.probe_targets()) | set(self.view.suspected)):
            seen = self.view.last_seen.get(peer)
            suspicion = self.view.suspected.get(peer)
            out.append(
                {
                    "peer_id": peer,
                    "connected": peer in connected,
                    "suspected": suspicion is not None,
                    "suspected_for_s": round(now - suspicion.since, 3) if suspicion else None,
                    "reason": suspicion.reason if suspicion else None,
                    "last_seen_s_ago": round(now - seen, 3) if seen is not None else None,
                }
            )
        return out
