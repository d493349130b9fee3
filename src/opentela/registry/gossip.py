"""Replication over /otela/gossip/1: push each change to a few peers at once, and repair the rest by anti-entropy.

With a partial view (`overlay`), a record new to this replica is flooded to the active-view peers other than the
one it came from (a peer that already holds it changes nothing and stops the flood there), anti-entropy runs
with a random active peer (now and then a passive one), and the first exchange with a new neighbour is the
"hello" of a node that has not synced yet. Without one, pushes go to `fanout` random live peers, anti-entropy to
a random live peer, and every new connection starts an exchange.

Anti-entropy exchange (initiator I, responder R), one stream:
  I -> R  {"t": "sum", "h": hash of I's digest[, "s": [shards], "k": shard count][, "u": 1]}
  R -> I  {"t": "same"[, "u": 1]}                           (done: nothing differs; the idle case)
       or {"t": "digest", "d": R's digest[, "u": 1]}
  ("u": 1 says the sender's own first sync is incomplete, so equal digests prove nothing to the other side.)
  I -> R  {"t": "want", "k": keys I wants} then {"t": "recs", "r": [...]}* then {"t": "end"}   (what R lacks)
  R -> I  {"t": "recs", "r": [...]}* then {"t": "end"}                                         (what I wants)
Push: I -> R {"t": "push", "r": [...]}*, then half-close.

A joiner's first sync asks each of its first neighbours for one part of the registry ("s" and "k": the shards of
`join_sync.shard_of` wanted; R's digest and both record lists are limited to keys in them), so joins do not all
land on the bootstrap peers; a responder that ignores the fields sends its whole digest and I filters it.
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
from opentela.registry.join_sync import JoinSync, shard_of
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
        self._push_changes = True  # whether the changes they make are pushed on
        self._hash: tuple[int, bytes] | None = None  # (records, hash of our digest) until the next change
        self._synced_at: float | None = None  # when our latest anti-entropy exchange completed
        self._join_sync: JoinSync | None = None  # a joiner's first sync, split over its first neighbours
        if overlay is not None and self.config.join_sync_shards > 1:
            self._join_sync = JoinSync(self.config.join_sync_shards, self.config.join_sync_wait)
        self._wake = asyncio.Event()
        self._tasks = TaskSet("gossip")
        self.counters: dict[str, int] = {
            "bytes_out": 0,
            "bytes_in": 0,
            "pushes_sent": 0,
            "pushes_received": 0,
            "rounds": 0,
            "rounds_same": 0,
            "parts_served": 0,
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
        if not local and not self._push_changes:
            return
        self._pending[record.session_id] = (record, None if local else self._source)
        self._wake.set()

    def _on_connect(self, peer: PeerId) -> None:
        # A new neighbour gets the full picture in one exchange, instead of waiting for the next round.
        self._spawn(self._anti_entropy_with(peer, ()), "gossip-hello")

    def _on_neighbour(self, peer: PeerId) -> None:
        # Only a node that has never synced needs the hello: the others are one anti-entropy round from every
        # change anyway, and a synced node's hello to a new neighbour (a joiner, most of the time) would send
        # it the whole registry. A joiner's first sync is split over its first neighbours (see join_sync.py).
        plan = self._join_sync
        if plan is not None and self._joining():
            assert self.overlay is not None
            plan.contacts = self.overlay.contacts
            first = plan.started is None
            shards = plan.on_neighbour(peer, time.monotonic())
            if shards:
                self._spawn(self._pull_shards(peer, shards), "gossip-join-sync")
            if first:
                # Our record to the first neighbour at once (usually the contact, whose part may wait): it floods
                # it, so the mesh learns of the join as fast as when the contact pulled everything from us.
                self._spawn(self._push_to(peer, self._addrs(peer), [self.registry.local]), "gossip-join-push")
                self._spawn(self._join_sync_loop(), "gossip-join-sync-wait")
            return
        if not self.synced:
            self._spawn(self._anti_entropy_with(peer, self._addrs(peer)), "gossip-hello")

    def _joining(self) -> bool:
        """Whether our first sync runs in parts now: we joined through a contact and have not synced yet."""
        plan = self._join_sync
        joined = self.overlay is not None and bool(self.overlay.contacts)  # a founder joined through no one
        return joined and self._synced_at is None and plan is not None and not plan.complete

    async def _join_sync_loop(self) -> None:
        """After the wait, and again every wait until the first sync is complete: ask the neighbours we have
        for the parts nobody is sending (a contact only when no other neighbour came)."""
        plan = self._join_sync
        assert plan is not None
        while self._synced_at is None and not plan.complete:
            await asyncio.sleep(plan.wait)
            for peer, shards in plan.reassign(self._neighbours(), time.monotonic()).items():
                self._spawn(self._pull_shards(peer, shards), "gossip-join-sync")

    async def _pull_shards(self, peer: PeerId, shards: tuple[int, ...]) -> None:
        """One exchange with `peer` limited to `shards` of the keys; the first sync is done when all arrived."""
        plan = self._join_sync
        assert plan is not None
        ok = await self._anti_entropy_with(peer, self._addrs(peer), (shards, plan.shards))
        plan.finished(peer, ok)
        if plan.complete and self._synced_at is None:
            self._synced_at = time.monotonic()

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
            if self._joining():
                continue  # the first sync is under way, in parts; a whole round now would pull it all again
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

    async def _anti_entropy_with(
        self, peer: PeerId, addrs: Iterable[str], part: tuple[tuple[int, ...], int] | None = None
    ) -> bool:
        """One exchange with `peer` (over the keys in `part`'s shards only, when given); True when it completed."""
        try:
            async with asyncio.timeout(self.config.gossip_timeout):
                stream = await self._open(peer, addrs)
                try:
                    whole = await self._initiate(stream, part)
                finally:
                    await stream.aclose()
            self.counters["rounds"] += 1
            if part is None and whole:
                self._synced_at = time.monotonic()
            return whole
        except (OpenTelaError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            self.counters["errors"] += 1
            logger.debug("anti-entropy with %s failed: %r", peer, exc)
            return False

    def _digest_hash(self) -> bytes:
        """The hash of our digest, computed again only after a change (or a compaction, which shrinks it)."""
        if self._hash is None or self._hash[0] != len(self.registry):
            self._hash = (len(self.registry), digest_hash(self.registry.digest()))
        return self._hash[1]

    def _apply_from(self, peer: PeerId, records: list[Any], flood: bool = True) -> None:
        """Merge records a peer sent; the changes they make are flooded on to everyone but that peer (to no one
        when `flood` is False)."""
        self._source, self._push_changes = peer, flood
        try:
            self.registry.apply_wire(records)
        finally:
            self._source, self._push_changes = None, True

    @property
    def synced(self) -> bool:
        """Whether our replica is complete as far as we know: we finished an exchange, or founded the mesh."""
        return self._synced_at is not None or self.overlay is None or not self.overlay.contacts

    async def wait_synced(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until our first sync is complete; whether it is."""
        deadline = time.monotonic() + timeout
        while not self.synced and time.monotonic() < deadline:  # noqa: ASYNC110 (several paths set it)
            await asyncio.sleep(0.02)
        return self.synced

    async def _initiate(self, stream: Stream, part: tuple[tuple[int, ...], int] | None = None) -> bool:
        """Run one exchange; True unless the responder said its own replica is still incomplete."""
        first: dict[str, Any] = {"t": "sum", "h": self._digest_hash()}
        if part is not None:
            first.update(s=list(part[0]), k=part[1])
        if not self.synced:
            first["u"] = 1
        await self._send(stream, first)
        reply = await self._recv(stream)
        # Two replicas equally incomplete look the same: only a synced responder's answer completes a part.
        whole = not reply.get("u")
        if reply.get("t") == "same":
            self.counters["rounds_same"] += 1
            return whole
        theirs = _parse_digest(reply)
        wanted = self.registry.map.wanted_from(theirs)
        newer = self.registry.map.newer_than(theirs)
        if part is not None:
            shards, count = set(part[0]), part[1]
            theirs = {k: v for k, v in theirs.items() if shard_of(k, count) in shards}
            wanted = [k for k in wanted if shard_of(k, count) in shards]
            # Our own record goes in every part: until a neighbour holds it, nobody floods it for us.
            mine = self.registry.local.session_id
            newer = [r for r in newer if r.session_id == mine or shard_of(r.session_id, count) in shards]
        await self._send(stream, {"t": "want", "k": wanted})
        await self._send_records(stream, "recs", newer)
        await self._send(stream, {"t": "end"})
        # The parts of a joiner's first sync are records its (synced) neighbours hold already: flooding them on
        # would send them the whole registry back, so they are merged without being pushed.
        self._apply_from(stream.remote_peer, await self._recv_records(stream), flood=part is None)
        return whole

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
                    same: dict[str, Any] = {"t": "same"}
                    if not self.synced:
                        same["u"] = 1
                    await self._send(stream, same)
                    if not first.get("u"):  # equal to a synced replica: ours is complete too
                        self._synced_at = time.monotonic()
                    return
                ours = self.registry.digest()
                part = _parse_part(first)
                if part is not None:
                    shards, count = part
                    ours = {k: v for k, v in ours.items() if shard_of(k, count) in shards}
                    self.counters["parts_served"] += 1
                reply: dict[str, Any] = {"t": "digest", "d": {k: list(v) for k, v in ours.items()}}
                if not self.synced:
                    reply["u"] = 1  # unsynced: a joiner asks someone else for this part as well
                await self._send(stream, reply)
                want = await self._recv(stream)
                keys = want.get("k", [])
                if not isinstance(keys, list):
                    raise ProtocolError("gossip want list is not a list")
                # While we join, what a neighbour sends is what the mesh holds already: merged, not pushed on.
                joining = self._joining()
                self._apply_from(stream.remote_peer, await self._recv_records(stream), flood=not joining)
                if part is None and not first.get("u") and self._synced_at is None:
                    self._synced_at = (
                        time.monotonic()
                    )  # a synced initiator sent us all it had: we hold it all
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


def _parse_part(msg: dict[str, Any]) -> tuple[set[int], int] | None:
    """The shards a "sum" asks about (None: all keys); ProtocolError when the fields are malformed."""
    if "s" not in msg and "k" not in msg:
        return None
    shards, count = msg.get("s"), msg.get("k")
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 1024):
        raise ProtocolError("gossip shard count must be an integer in [1, 1024]")
    if not (isinstance(shards, list) and all(isinstance(x, int) and 0 <= x < count for x in shards)):
        raise ProtocolError("gossip shards must be a list of integers below the shard count")
    return set(shards), count


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
