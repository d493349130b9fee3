"""Replication over /otela/gossip/1: push each change to a few peers at once, and repair the rest by anti-entropy.

With a partial view (`overlay`), a record new to this replica is flooded to the active-view peers other than the
one it came from (a peer that already holds it changes nothing and stops the flood there), anti-entropy runs
with a random active peer (now and then a passive one), and the first exchange with a new neighbour is the
"hello" of a node that has not synced yet. Without one, pushes go to `fanout` random live peers, anti-entropy to
a random live peer, and every new connection starts an exchange.

Anti-entropy exchange (initiator I, responder R), one stream:
  I -> R  {"t": "sum", "h": hash of I's digest}
  R -> I  {"t": "same"}                                     (done: nothing differs; the idle case)
       or {"t": "digest", "d": R's digest}
  I -> R  {"t": "want", "k": keys I wants} then {"t": "recs", "r": [...]}* then {"t": "end"}   (what R lacks)
  R -> I  {"t": "recs", "r": [...]}* then {"t": "end"}                                         (what I wants)
Push: I -> R {"t": "push", "r": [...]}*, then half-close.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import Iterable
from typing import Any

import msgpack

from opentela._tasks import TaskSet
from opentela._types import PROTO_GOSSIP, Lifecycle, PeerId, Stream
from opentela.errors import OpenTelaError, ProtocolError
from opentela.fabric.host import Host
from opentela.fabric.messages import encode_msg, read_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.crdt import Digest
from opentela.registry.membership import Membership
from opentela.registry.overlay import Overlay
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)

RESET_GOSSIP_ERROR = 0x100  # application reset codes start at 0x100; lower ones are the fabric's


def digest_hash(digest: Digest) -> bytes:
    """A short, order-independent fingerprint of a digest."""
    packed = msgpack.packb(sorted((k, list(v)) for k, v in digest.items()), use_bin_type=True)
    return hashlib.blake2b(packed, digest_size=16).digest()


class Gossip:
    """The replication driver of one node."""

    def __init__(
        self,
        host: Host,
        registry: Registry,
        membership: Membership,
        *,
        config: RegistryConfig | None = None,
        overlay: Overlay | None = None,
    ) -> None:
        self.host = host
        self.registry = registry
        self.membership = membership
        self.overlay = overlay
        self.config = config or RegistryConfig()
        self._rng = random.Random()
        self._pending: dict[str, tuple[NodeRecord, PeerId | None]] = {}  # change -> the peer it came from
        self._source: PeerId | None = None  # the peer whose records are being applied right now
        self._hash: tuple[int, bytes] | None = None  # (records, hash of our digest) until the next change
        self._synced_at: float | None = None  # when our latest anti-entropy exchange completed
        self._wake = asyncio.Event()
        self._tasks = TaskSet("gossip")
        self.counters: dict[str, int] = {
            "bytes_out": 0,
            "bytes_in": 0,
            "pushes_sent": 0,
            "pushes_received": 0,
            "rounds": 0,
            "rounds_same": 0,
            "errors": 0,
        }

    def __repr__(self) -> str:
        return f"<Gossip pending={len(self._pending)} rounds={self.counters['rounds']}>"

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve the protocol and start pushing and anti-entropy."""
        self.host.set_handler(PROTO_GOSSIP, self.rpc_gossip)
        self.registry.on_change(self._on_change)
        if self.overlay is None:
            self.host.on_peer_connected(self._on_connect)
        else:
            self.overlay.on_neighbour_up(self._on_neighbour)
        self._spawn(self._push_loop(), "gossip-push")
        self._spawn(self._anti_entropy_loop(), "gossip-anti-entropy")

    async def aclose(self) -> None:
        """Stop all gossip tasks."""
        await self._tasks.aclose()

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.spawn(coro, name)

    def stats(self) -> dict[str, Any]:
        """Traffic and round counters."""
        return dict(self.counters)

    # --- peers --------------------------------------------------------------------------------------------
    def live_peers(self) -> dict[PeerId, tuple[str, ...]]:
        """Peers to gossip with and their addresses: live records of others, plus connected peers."""
        me = self.host.peer_id
        peers: dict[PeerId, tuple[str, ...]] = {}
        for record in self.registry.records():
            if record.peer_id == me or record.lifecycle > Lifecycle.SERVING:
                continue
            if not self.membership.is_suspected(record.peer_id):
                peers[record.peer_id] = record.addrs
        for peer in self.host.connected_peers():
            peers.setdefault(peer, ())
        return peers

    def _neighbours(self) -> list[PeerId]:
        """Active-view peers that SWIM does not suspect (a hung one would hold every push for a timeout)."""
        assert self.overlay is not None
        return [p for p in self.overlay.active() if not self.membership.is_suspected(p)]

    def _addrs(self, peer: PeerId) -> tuple[str, ...]:
        return self.overlay.addrs_of(peer) if self.overlay is not None else ()

    async def _open(self, peer: PeerId, addrs: Iterable[str]) -> Stream:
        return await self.host.open_stream(
            peer, PROTO_GOSSIP, addrs=tuple(addrs), timeout=self.config.gossip_timeout
        )

    # --- push ---------------------------------------------------------------------------------------------
    def _on_change(self, record: NodeRecord, local: bool) -> None:
        self._hash = None
        self._pending[record.session_id] = (record, None if local else self._source)
        self._wake.set()

    def _on_connect(self, peer: PeerId) -> None:
        # A new neighbour gets the full picture in one exchange, instead of waiting for the next round.
        self._spawn(self._anti_entropy_with(peer, ()), "gossip-hello")

    def _on_neighbour(self, peer: PeerId) -> None:
        # Only a node that has not synced lately needs the hello (a joiner, with its contact): the others are
        # one anti-entropy round from every change anyway, and a hello per new link would cost a digest each.
        if self._synced_at is None or time.monotonic() - self._synced_at > self.config.anti_entropy_interval:
            self._spawn(self._anti_entropy_with(peer, self._addrs(peer)), "gossip-hello")

    async def _push_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = list(self._pending.values()), {}
            if not batch or self.config.fanout == 0:
                continue
            if self.overlay is not None:
                await self._flood(batch)
                continue
            peers = self.live_peers()
            if not peers:
                continue
            records = [r for r, _ in batch]
            chosen = self._rng.sample(sorted(peers), min(self.config.fanout, len(peers)))
            await asyncio.gather(*(self._push_to(p, peers[p], records) for p in chosen))

    async def _flood(self, batch: list[tuple[NodeRecord, PeerId | None]]) -> None:
        """Push each record to our neighbours, except the one it came from."""
        neighbours = self._neighbours()
        chosen = self._rng.sample(neighbours, min(self.config.fanout, len(neighbours)))
        pushes = []
        for peer in chosen:
            records = [r for r, source in batch if source != peer]
            if records:
                pushes.append(self._push_to(peer, self._addrs(peer), records))
        await asyncio.gather(*pushes)

    async def _push_to(self, peer: PeerId, addrs: Iterable[str], records: list[NodeRecord]) -> bool:
        try:
            async with asyncio.timeout(self.config.gossip_timeout):
                stream = await self._open(peer, addrs)
                try:
                    await self._send_records(stream, "push", records)
                    await stream.write_eof()
                finally:
                    await stream.aclose()
            self.counters["pushes_sent"] += 1
            return True
        except (OpenTelaError, TimeoutError, OSError) as exc:
            self.counters["errors"] += 1
            logger.debug("push to %s failed: %r", peer, exc)
            return False

    async def flush(self, timeout: float = 2.0) -> None:
        """Send our own record to every reachable peer now and wait (bounded): used before exiting.

        With a partial view, "every reachable peer" is our neighbours, who flood it on; with none, a few
        random live peers.
        """
        peers = self.live_peers()
        if self.overlay is not None:
            neighbours = {p: self._addrs(p) for p in self._neighbours()}
            if neighbours:
                peers = neighbours
            else:
                chosen = self._rng.sample(sorted(peers), min(max(1, self.config.fanout), len(peers)))
                peers = {p: peers[p] for p in chosen}
        if not peers:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(self._push_to(p, a, [self.registry.local]) for p, a in peers.items()))

    # --- anti-entropy -------------------------------------------------------------------------------------
    async def _anti_entropy_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.anti_entropy_interval * (0.5 + self._rng.random()))
            if self.overlay is not None:
                peer = self._anti_entropy_peer()
                if peer is not None:
                    await self._anti_entropy_with(peer, self._addrs(peer))
                continue
            peers = self.live_peers()
            if peers:
                peer = self._rng.choice(sorted(peers))
                await self._anti_entropy_with(peer, peers[peer])

    def _anti_entropy_peer(self) -> PeerId | None:
        """A random neighbour; now and then (and when we have no neighbour) a random passive peer.

        The passive rounds cost a short-lived connection each, and they are what repairs replicas across a
        split of the active views, which flooding and neighbour rounds alone would never cross.
        """
        assert self.overlay is not None
        neighbours = self._neighbours()
        passive = [p for p in self.overlay.passive() if not self.membership.is_suspected(p)]
        if passive and (not neighbours or self._rng.random() < self.config.passive_anti_entropy):
            return self._rng.choice(passive)
        return self._rng.choice(neighbours) if neighbours else None

    async def _anti_entropy_with(self, peer: PeerId, addrs: Iterable[str]) -> bool:
        """One exchange with `peer`; True when it completed."""
        try:
            async with asyncio.timeout(self.config.gossip_timeout):
                stream = await self._open(peer, addrs)
                try:
                    await self._initiate(stream)
                finally:
                    await stream.aclose()
            self.counters["rounds"] += 1
            self._synced_at = time.monotonic()
            return True
        except (OpenTelaError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            self.counters["errors"] += 1
            logger.debug("anti-entropy with %s failed: %r", peer, exc)
            return False

    def _digest_hash(self) -> bytes:
        """The hash of our digest, computed again only after a change (or a compaction, which shrinks it)."""
        if self._hash is None or self._hash[0] != len(self.registry):
            self._hash = (len(self.registry), digest_hash(self.registry.digest()))
        return self._hash[1]

    def _apply_from(self, peer: PeerId, records: list[Any]) -> None:
        """Merge records a peer sent; the changes they make are flooded on to everyone but that peer."""
        self._source = peer
        try:
            self.registry.apply_wire(records)
        finally:
            self._source = None

    async def _initiate(self, stream: Stream) -> None:
        await self._send(stream, {"t": "sum", "h": self._digest_hash()})
        reply = await self._recv(stream)
        if reply.get("t") == "same":
            self.counters["rounds_same"] += 1
            return
        theirs = _parse_digest(reply)
        await self._send(stream, {"t": "want", "k": self.registry.map.wanted_from(theirs)})
        await self._send_records(stream, "recs", self.registry.map.newer_than(theirs))
        await self._send(stream, {"t": "end"})
        self._apply_from(stream.remote_peer, await self._recv_records(stream))

    async def rpc_gossip(self, stream: Stream) -> None:
        """Serve one gossip stream (push or anti-entropy)."""
        self.membership.confirm_alive(stream.remote_peer)
        try:
            first = await self._recv(stream)
            kind = first.get("t")
            if kind == "push":
                self.counters["pushes_received"] += 1
                self._apply_from(stream.remote_peer, _pushed(first))
                with contextlib.suppress(asyncio.IncompleteReadError):
                    while True:
                        more = await self._recv(stream)
                        self._apply_from(stream.remote_peer, _pushed(more))
            elif kind == "sum":
                if first.get("h") == self._digest_hash():
                    await self._send(stream, {"t": "same"})
                    self._synced_at = time.monotonic()
                    return
                ours = self.registry.digest()
                await self._send(stream, {"t": "digest", "d": {k: list(v) for k, v in ours.items()}})
                want = await self._recv(stream)
                keys = want.get("k", [])
                if not isinstance(keys, list):
                    raise ProtocolError("gossip want list is not a list")
                self._apply_from(stream.remote_peer, await self._recv_records(stream))
                records = [r for k in keys if isinstance(k, str) and (r := self.registry.get(k)) is not None]
                await self._send_records(stream, "recs", records)
                await self._send(stream, {"t": "end"})
            else:
                raise ProtocolError(f"unknown gossip message {kind!r}")
        except (OpenTelaError, asyncio.IncompleteReadError) as exc:
            self.counters["errors"] += 1
            logger.debug("gossip from %s failed: %r", stream.remote_peer, exc)
            stream.reset(RESET_GOSSIP_ERROR, "gossip error")
        finally:
            await stream.aclose()

    # --- messages -----------------------------------------------------------------------------------------
    async def _send(self, stream: Stream, obj: dict[str, Any]) -> None:
        data = encode_msg(obj, self.config.max_message_bytes)
        self.counters["bytes_out"] += len(data)
        await stream.write(data)

    async def _recv(self, stream: Stream) -> dict[str, Any]:
        msg = await read_msg(stream, self.config.max_message_bytes)
        self.counters["bytes_in"] += len(msgpack.packb(msg, use_bin_type=True)) + 4
        if not isinstance(msg, dict):
            raise ProtocolError("gossip message is not a map")
        return msg

    async def _send_records(self, stream: Stream, kind: str, records: list[NodeRecord]) -> None:
        step = self.config.max_records_per_message
        for i in range(0, len(records), step):
            await self._send(stream, {"t": kind, "r": [r.to_wire() for r in records[i : i + step]]})

    async def _recv_records(self, stream: Stream) -> list[Any]:
        out: list[Any] = []
        while True:
            msg = await self._recv(stream)
            if msg.get("t") == "end":
                return out
            batch = msg.get("r")
            if msg.get("t") != "recs" or not isinstance(batch, list):
                raise ProtocolError("expected gossip records")
            out.extend(batch)


def _pushed(msg: dict[str, Any]) -> list[Any]:
    """The records of a push message; ProtocolError when it holds anything but a list of them."""
    batch = msg.get("r", [])
    if msg.get("t") != "push" or not isinstance(batch, list):
        raise ProtocolError("expected pushed gossip records")
    return batch


def _parse_digest(msg: dict[str, Any]) -> Digest:
    raw = msg.get("d")
    if msg.get("t") != "digest" or not isinstance(raw, dict):
        raise ProtocolError("expected a gossip digest")
    digest: Digest = {}
    for key, rank in raw.items():
        if not (isinstance(key, str) and isinstance(rank, list | tuple) and len(rank) == 2):
            raise ProtocolError("malformed gossip digest entry")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in rank):
            raise ProtocolError("malformed gossip digest rank")
        digest[key] = (rank[0], rank[1])
    return digest
