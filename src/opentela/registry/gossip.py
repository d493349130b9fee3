"""Replication over /otela/gossip/1: push each change to a few peers at once, and repair the rest by anti-entropy.

With a partial view (`overlay`), a record new to this replica goes to the active-view peers other than the one
it came from: a SERVING record as itself to eager neighbours and as its id to lazy ones (`lazy_push.py`: the
eager links thin out to a tree by prunes, and an id whose record does not follow is grafted), a JOIN, DOWN or
LEFT record as itself to all of them. Anti-entropy runs with a random
active peer (now and then a passive one), and the first exchange with a new neighbour is the "hello" of a node
that has not synced yet. Without one, pushes go to `fanout` random live peers, anti-entropy to a random live
peer, and every new connection starts an exchange.

Anti-entropy exchange (initiator I, responder R), one stream:
  I -> R  {"t": "sum", "h": hash of I's digest[, "s": [shards], "k": shard count][, "u": 1]}
  R -> I  {"t": "same"[, "u": 1]}                           (done: nothing differs; the idle case)
       or {"t": "digest", "d": R's digest[, "u": 1]}
       or {"t": "sums", "k": n, "h": [hash of each of n classes of keys]}       (I said "l": 1, no "s")
           I -> R {"t": "shards", "s": [classes whose hashes differ]};  R -> I {"t": "digest", ...} of those
  ("u": 1 says the sender's own first sync is incomplete, so equal digests prove nothing to the other side.)
  I -> R  {"t": "want", "k": keys I wants} then {"t": "recs", "r": [...]}* then {"t": "end"}   (what R lacks)
  R -> I  {"t": "recs", "r": [...]}* then {"t": "end"}                                         (what I wants)
Push: I -> R {"t": "push", "r": [...][, "i": [[session, lifecycle, version], ...]][, "x": 1]}*, then half-close.
  ("i": ids of records I holds and did not send, "x": 1 asks R to send I ids instead of records from now on.)
Graft: I -> R {"t": "graft", "k": [session ids]};  R -> I {"t": "recs", "r": [...]}* then {"t": "end"}
  (I was told of those records and they did not come: R sends them, and sends I records again from now on.)
"sum", "same" and "digest" carry "l": 1: the sender understands ids, prunes, grafts and "sums" (the digest sent
by classes, `digest_shards.py`). Only a peer that said so is ever sent them; one that never does (an older node,
which ignores the field) gets every record and whole digests.

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
from opentela.fabric.messages import encode_msg, read_msg_sized
from opentela.registry._config import RegistryConfig
from opentela.registry.crdt import Digest
from opentela.registry.digest_shards import differing, shard_count, shard_hashes
from opentela.registry.join_sync import JoinSync, shard_of
from opentela.registry.lazy_push import LazyPush
from opentela.registry.membership import Membership
from opentela.registry.overlay import Overlay
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)

RESET_GOSSIP_ERROR = 0x100  # application reset codes start at 0x100; lower ones are the fabric's
MAX_IDS = 1024  # ids per push message, and keys per graft: more is a protocol error
Rank = tuple[int, int]


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
        lazy_push: bool = True,
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
        # Eager and lazy neighbours (partial views only); `lazy_push` False floods, as before lazy push.
        self._lazy: LazyPush[PeerId, str, Rank] | None = None
        if overlay is not None:
            self._lazy = LazyPush(prune=lazy_push)
        self._graft_wake = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks = TaskSet("gossip")
        self.counters: dict[str, int] = {
            "bytes_out": 0,
            "bytes_in": 0,
            "pushes_sent": 0,
            "pushes_received": 0,
            "rounds": 0,
            "rounds_same": 0,
            "rounds_by_shards": 0,
            "parts_served": 0,
            "ids_sent": 0,
            "grafts_served": 0,
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
            self.overlay.on_neighbour_down(self._on_neighbour_down)
            for peer in self.overlay.active():
                self._on_neighbour_up_lazy(peer)
            self._spawn(self._graft_loop(), "gossip-graft")
        self._spawn(self._push_loop(), "gossip-push")
        self._spawn(self._anti_entropy_loop(), "gossip-anti-entropy")

    async def aclose(self) -> None:
        """Stop all gossip tasks."""
        await self._tasks.aclose()

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.spawn(coro, name)

    @property
    def lazy(self) -> LazyPush[PeerId, str, Rank] | None:
        """Which neighbours get records and which only ids (None without a partial view)."""
        return self._lazy

    def stats(self) -> dict[str, Any]:
        """Traffic and round counters (with lazy push: its counters, and how many neighbours are lazy)."""
        out: dict[str, Any] = dict(self.counters)
        if self._lazy is not None:
            out.update(self._lazy.counters)
            out["lazy_neighbours"] = len(self._lazy.lazy)
            out["neighbours"] = len(self._lazy.neighbours)
            out["capable_neighbours"] = len(self._lazy.capable)
            out["waiting_for"] = len(self._lazy.missing)
        return out

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
        if self._lazy is not None:
            self._lazy.arrived(record.session_id, record.rank)
        if not local and not self._push_changes:
            return
        self._pending[record.session_id] = (record, None if local else self._source)
        self._wake.set()

    def _on_connect(self, peer: PeerId) -> None:
        # A new neighbour gets the full picture in one exchange, instead of waiting for the next round.
        self._spawn(self._anti_entropy_with(peer, ()), "gossip-hello")

    def _on_neighbour_up_lazy(self, peer: PeerId) -> None:
        if self._lazy is not None:
            self._lazy.neighbour_up(peer)

    def _on_neighbour_down(self, peer: PeerId) -> None:
        if self._lazy is not None:
            for lazy_peer in self._lazy.neighbour_down(peer):
                self._spawn(self._graft(lazy_peer, []), "gossip-reeager")

    def _on_neighbour(self, peer: PeerId) -> None:
        self._on_neighbour_up_lazy(peer)
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

    def _parts_coming(self) -> bool:
        """Whether our first sync's parts are on their way: a pull is in flight, or the first neighbours may still
        come. Otherwise (every pull failed, as when the neighbours are joining too) a whole round is welcome."""
        plan = self._join_sync
        if plan is None or not self._joining():
            return False
        return bool(plan.pulling) or not plan.expired(time.monotonic())

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
        """Push each record to our neighbours, except the one it came from: the record to eager ones, its id to
        lazy ones."""
        neighbours = self._neighbours()
        chosen = self._rng.sample(neighbours, min(self.config.fanout, len(neighbours)))
        pushes = []
        for peer in chosen:
            records = [r for r, source in batch if source != peer]
            if not records:
                continue
            lazy = self._lazy
            if lazy is not None and lazy.is_lazy(peer):
                flooded = [r for r in records if lazy.flooded(r.lifecycle)]
                ids = [[r.session_id, int(r.lifecycle), r.version] for r in records if r not in flooded]
                self.counters["ids_sent"] += len(ids)
                pushes.append(self._push_to(peer, self._addrs(peer), flooded, ids=ids))
            else:
                pushes.append(self._push_to(peer, self._addrs(peer), records))
        await asyncio.gather(*pushes)

    async def _push_to(
        self,
        peer: PeerId,
        addrs: Iterable[str],
        records: list[NodeRecord],
        *,
        ids: list[list[Any]] | None = None,
        prune: bool = False,
    ) -> bool:
        """One push stream: `records`, or `ids` of records (an announcement), or a prune."""
        try:
            async with asyncio.timeout(self.config.gossip_timeout):
                stream = await self._open(peer, addrs)
                try:
                    await self._send_records(stream, "push", records)
                    ids = ids or []
                    for i in range(0, len(ids), MAX_IDS):
                        await self._send(stream, {"t": "push", "i": ids[i : i + MAX_IDS]})
                    if prune:
                        await self._send(stream, {"t": "push", "x": 1})
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
        first: dict[str, Any] = {"t": "sum", "h": self._digest_hash(), "l": 1}
        if part is not None:
            first.update(s=list(part[0]), k=part[1])
        if not self.synced:
            first["u"] = 1
        await self._send(stream, first)
        reply = await self._recv(stream)
        if reply.get("l") == 1 and self._lazy is not None:
            self._lazy.learned(stream.remote_peer)
        # Two replicas equally incomplete look the same: only a synced responder's answer completes a part.
        whole = not reply.get("u")
        if reply.get("t") == "same":
            self.counters["rounds_same"] += 1
            return whole
        if reply.get("t") == "sums":
            # The responder sent a hash per class of keys: ask for the digest of the classes that differ.
            count, hashes = _parse_sums(reply)
            differ = differing(shard_hashes(self.registry.digest(), count), hashes)
            await self._send(stream, {"t": "shards", "s": differ})
            restrict = (set(differ), count)
            reply = await self._recv(stream)
            self.counters["rounds_by_shards"] += 1
        elif part is not None:
            restrict = (set(part[0]), part[1])
        else:
            restrict = None
        theirs = _parse_digest(reply)
        wanted = self.registry.map.wanted_from(theirs)
        newer = self.registry.map.newer_than(theirs)
        if restrict is not None:
            shards, count = restrict
            wanted = [k for k in wanted if shard_of(k, count) in shards]
            # Our own record goes in every part of a first sync: until a neighbour holds it, nobody floods it.
            mine = self.registry.local.session_id if part is not None else None
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
                self._on_push(stream.remote_peer, first)
                with contextlib.suppress(asyncio.IncompleteReadError):
                    while True:
                        self._on_push(stream.remote_peer, await self._recv(stream))
            elif kind == "graft":
                await self._serve_graft(stream, first)
            elif kind == "sum":
                if first.get("l") == 1 and self._lazy is not None:
                    self._lazy.learned(stream.remote_peer)
                if _parse_part(first) is None and self._parts_coming():
                    # A whole round now would have this neighbour send us all it holds, which our parts bring
                    # anyway: decline it as an unsynced "same".
                    await self._send(stream, {"t": "same", "u": 1, "l": 1})
                    return
                if first.get("h") == self._digest_hash():
                    same: dict[str, Any] = {"t": "same", "l": 1}
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
                elif first.get("l") == 1 and (count := shard_count(len(ours))):
                    # An initiator that knows shards: hashes of the classes first, then the digest of those that
                    # differ (digest_shards.py).
                    sums: dict[str, Any] = {"t": "sums", "k": count, "h": shard_hashes(ours, count), "l": 1}
                    if not self.synced:
                        sums["u"] = 1
                    await self._send(stream, sums)
                    asked = _parse_shards(await self._recv(stream), count)
                    ours = {k: v for k, v in ours.items() if shard_of(k, count) in asked}
                reply: dict[str, Any] = {"t": "digest", "d": {k: list(v) for k, v in ours.items()}, "l": 1}
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

    # --- lazy push: announcements, prunes, grafts --------------------------------------------------------------
    def _on_push(self, peer: PeerId, msg: dict[str, Any]) -> None:
        """One push message: merge its records (and prune the link if none was news), note its ids."""
        records, ids = _pushed(msg), _announced(msg)
        lazy = self._lazy
        if lazy is None:
            self._apply_from(peer, records)
            return
        now = time.monotonic()
        if msg.get("x") == 1:
            lazy.pruned(peer)
        # Only records that go along the tree tell whether this link is redundant (the flooded ones come over
        # every link). News is judged before merging: a held eviction or a refused record is no proof of a
        # redundant link. (What merges ends the waits for it through `_on_change`; what does not, a forged copy
        # included, leaves them to the graft.)
        judged = [x for x in map(_wire_rank, records) if x is None or not lazy.flooded(x[1][0])]
        fresh = any(x is None or self._older(*x) for x in judged)
        self._apply_from(peer, records)
        if judged and lazy.received(peer, fresh, now):
            self._spawn(self._push_to(peer, self._addrs(peer), [], prune=True), "gossip-prune")
        started = False
        for key, rank in ids:
            current = self.registry.get(key)
            started |= lazy.announced(peer, key, rank, None if current is None else current.rank, now)
        if started:
            self._graft_wake.set()

    def _older(self, key: str, rank: Rank) -> bool:
        """Whether our replica holds `key` below `rank` (or not at all)."""
        current = self.registry.get(key)
        return current is None or current.rank < rank

    async def _graft_loop(self) -> None:
        """Ask announcers for the records whose ids came and whose records did not, once their wait is over."""
        lazy = self._lazy
        assert lazy is not None
        while True:
            due = lazy.next_due()
            self._graft_wake.clear()
            if due is None or due > time.monotonic():
                delay = None if due is None else due - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._graft_wake.wait()
                continue
            for peer, keys in lazy.due(time.monotonic()).items():
                self._spawn(self._graft(peer, keys), "gossip-graft")

    async def _graft(self, peer: PeerId, keys: list[str]) -> None:
        """Ask `peer` for the records of `keys` (announced by it); it sends us records again from now on."""
        try:
            async with asyncio.timeout(self.config.gossip_timeout):
                stream = await self._open(peer, self._addrs(peer))
                try:
                    await self._send(stream, {"t": "graft", "k": keys[:MAX_IDS]})
                    records = await self._recv_records(stream)
                finally:
                    await stream.aclose()
        except (OpenTelaError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            self.counters["errors"] += 1
            logger.debug("graft from %s failed: %r", peer, exc)
            return
        self._apply_from(peer, records)
        if self._lazy is not None:
            # The announcer answered: what it sent ends the wait even if it did not merge (a held eviction),
            # which asking again would not change.
            for key, rank in filter(None, map(_wire_rank, records)):
                self._lazy.arrived(key, rank)

    async def _serve_graft(self, stream: Stream, msg: dict[str, Any]) -> None:
        """A neighbour asks for records we announced: send them, and push records to it again."""
        keys = msg.get("k")
        if not (isinstance(keys, list) and len(keys) <= MAX_IDS):
            raise ProtocolError("a graft names a short list of keys")
        if self._lazy is not None:
            self._lazy.grafted(stream.remote_peer)
        self.counters["grafts_served"] += 1
        records = [r for k in keys if isinstance(k, str) and (r := self.registry.get(k)) is not None]
        await self._send_records(stream, "recs", records)
        await self._send(stream, {"t": "end"})

    # --- messages -----------------------------------------------------------------------------------------
    async def _send(self, stream: Stream, obj: dict[str, Any]) -> None:
        data = encode_msg(obj, self.config.max_message_bytes)
        self.counters["bytes_out"] += len(data)
        await stream.write(data)

    async def _recv(self, stream: Stream) -> dict[str, Any]:
        msg, size = await read_msg_sized(stream, self.config.max_message_bytes)
        self.counters["bytes_in"] += size
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


def _announced(msg: dict[str, Any]) -> list[tuple[str, Rank]]:
    """The ids a push message announces (none when absent); ProtocolError when malformed."""
    raw = msg.get("i", [])
    if not (isinstance(raw, list) and len(raw) <= MAX_IDS):
        raise ProtocolError("announced ids must be a short list")
    out = []
    for item in raw:
        if not (isinstance(item, list | tuple) and len(item) == 3):
            raise ProtocolError("an announced id is [session, lifecycle, version]")
        key, lifecycle, version = item
        if not (
            isinstance(key, str) and 0 < len(key) <= 512 and _small_int(lifecycle) and _small_int(version)
        ):
            raise ProtocolError("malformed announced id")
        out.append((key, (lifecycle, version)))
    return out


def _small_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 2**53


def _wire_rank(obj: Any) -> tuple[str, Rank] | None:
    """(session, (lifecycle, version)) of a wire record, read without checking the rest; None if unreadable."""
    if not isinstance(obj, dict):
        return None
    key, lifecycle, version = obj.get("session_id"), obj.get("lifecycle"), obj.get("version")
    if isinstance(key, str) and isinstance(lifecycle, int) and isinstance(version, int):
        if _small_int(lifecycle) and _small_int(version):
            return key, (lifecycle, version)
    return None


def _parse_sums(msg: dict[str, Any]) -> tuple[int, list[bytes]]:
    """The class count and class hashes of a "sums" message; ProtocolError when malformed."""
    count, hashes = msg.get("k"), msg.get("h")
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 1024):
        raise ProtocolError("a sums message names between 1 and 1024 classes")
    if not (isinstance(hashes, list) and len(hashes) == count and all(isinstance(h, bytes) for h in hashes)):
        raise ProtocolError("a sums message holds one hash per class")
    return count, hashes


def _parse_shards(msg: dict[str, Any], count: int) -> set[int]:
    """The classes a "shards" message asks the digest of; ProtocolError when malformed."""
    shards = msg.get("s")
    if msg.get("t") != "shards" or not isinstance(shards, list) or len(shards) > count:
        raise ProtocolError("expected the classes that differ")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < count for x in shards):
        raise ProtocolError("a class is an integer below the class count")
    return set(shards)


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
