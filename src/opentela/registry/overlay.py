"""The partial-view overlay over /otela/view/1: runs `PartialView`, and keeps connections to active-view peers only.

Wire: one stream per batch of messages to one peer, `{"m": [message, ...]}`, answered `{"ok": 1}` once the peer
has applied them. The next batch to that peer waits for the answer, so every peer applies our messages in the
order we sent them, the one thing the state machine asks of its transport. A message is a map with the fields
it needs: `{"t": kind, "p": peer, "a": [addresses], "ttl": n, "hi": 1, "s": [peer ids]}`. "a" gives the
addresses of "p" (the joiner of a walk, the origin of a shuffle), or, on JOIN, the joiner's own: those nodes
may not be in the receiver's replica yet, and the receiver may have to dial them.

Besides the messages, the registry feeds the view: a live member is offered as a passive candidate while the
views have room (so a mesh of up to `active_view` nodes becomes a full mesh by itself), and a member that left
or was evicted is forgotten. Active peers' connections are protected from the connection manager's trimming;
passive peers get none, and the short-lived connections of requests and shuffle replies are left to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Any

from opentela._tasks import TaskSet
from opentela._types import PROTO_VIEW, Lifecycle, PeerId, SessionId, Stream
from opentela.errors import OpenTelaError, ProtocolError
from opentela.fabric.host import Host
from opentela.fabric.identity import is_peer_id
from opentela.fabric.messages import read_msg, write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.partial_view import Kind, PartialView, Send, ViewMessage
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)

MAX_VIEW_MESSAGE = 64 * 1024
MAX_BATCH = 64
MAX_ADDRS = 8
MAX_ADDR_TEXT = 512
MAX_TTL = 32
MAX_SAMPLE = 64
PROTECT_TAG = "view"

PeerListener = Callable[[PeerId], None]


class Overlay:
    """This node's neighbours in the mesh and the candidates to replace them, kept over the fabric."""

    def __init__(
        self,
        host: Host,
        registry: Registry,
        *,
        config: RegistryConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.registry = registry
        self.config = config or RegistryConfig()
        self._rng = rng or random.Random()
        self.view = PartialView(
            host.peer_id,
            active_max=max(2, self.config.active_view),
            passive_max=self.config.passive_view,
            active_walk=self.config.active_walk,
            passive_walk=self.config.passive_walk,
            rng=self._rng,
        )
        self._known: dict[PeerId, tuple[str, ...]] = {}  # live members of the replica -> their addresses
        self._sessions: dict[PeerId, set[SessionId]] = {}  # their live sessions
        self._book: dict[PeerId, tuple[str, ...]] = {}  # addresses heard in messages (joiners, origins)
        self._contacts: set[PeerId] = set()  # the bootstrap peers we joined through
        self._outbox: dict[PeerId, list[ViewMessage]] = {}
        self._sending: set[PeerId] = set()
        self._up: list[PeerListener] = []
        self._down: list[PeerListener] = []
        self._failed: list[PeerListener] = []
        self._usable: Callable[[PeerId], bool] = lambda peer: True
        self._tasks = TaskSet("overlay")
        self.counters: dict[str, int] = {
            "messages_sent": 0,
            "messages_received": 0,
            "send_failures": 0,
            "malformed": 0,
            "neighbours_up": 0,
            "neighbours_down": 0,
        }

    def __repr__(self) -> str:
        return f"<Overlay {self.view!r} known={len(self._known)}>"

    # --- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve the protocol, follow the registry and the fabric, start shuffling."""
        self.host.set_handler(PROTO_VIEW, self.rpc_view)
        self.host.on_peer_disconnected(self._on_disconnected)
        for record in self.registry.records():
            self._track(record)
        self.registry.on_change(self._on_record)
        self._tasks.spawn(self._tick_loop(), "overlay-tick")

    async def aclose(self) -> None:
        """Stop; neighbours see the connection go (a node leaving in order has already gossiped LEFT)."""
        await self._tasks.aclose()

    def join(self, contact: PeerId, addrs: tuple[str, ...] = ()) -> None:
        """Join through `contact` (a bootstrap peer): it walks us into a few other nodes' active views."""
        if addrs:
            self._book[contact] = addrs
        self._contacts.add(contact)
        self._apply(self.view.join, contact)

    @property
    def contacts(self) -> frozenset[PeerId]:
        """The bootstrap peers this node joined through."""
        return frozenset(self._contacts)

    # --- reads and hooks ------------------------------------------------------------------------------------
    def active(self) -> tuple[PeerId, ...]:
        """The active view: our neighbours."""
        return self.view.active

    def passive(self) -> tuple[PeerId, ...]:
        """The passive view."""
        return self.view.passive

    def addrs_of(self, peer: PeerId) -> tuple[str, ...]:
        """Where to dial `peer`: its live record's addresses, else those heard in overlay messages."""
        if peer == self.host.peer_id:
            return self.registry.local.addrs
        return self._known.get(peer) or self._book.get(peer, ())

    def on_neighbour_up(self, listener: PeerListener) -> None:
        """Call `listener(peer)` when a peer enters the active view."""
        self._up.append(listener)

    def on_neighbour_down(self, listener: PeerListener) -> None:
        """Call `listener(peer)` when a peer leaves the active view (for whatever reason)."""
        self._down.append(listener)

    def on_neighbour_failed(self, listener: PeerListener) -> None:
        """Call `listener(peer)` when an active peer's connection broke or a message to it failed."""
        self._failed.append(listener)

    def set_usable(self, usable: Callable[[PeerId], bool]) -> None:
        """Members failing `usable` (suspected by SWIM) are not offered to the view from the registry."""
        self._usable = usable

    def stats(self) -> dict[str, Any]:
        """Counters and view sizes."""
        return {
            **self.counters,
            "active": len(self.view.active),
            "passive": len(self.view.passive),
            "known": len(self._known),
        }

    # --- driving the state machine --------------------------------------------------------------------------
    def _apply(self, step: Callable[..., list[Send]], *args: Any) -> None:
        """Run one step of the view, then act on it: neighbours that came and went, and messages to send."""
        before = self.view.active
        sends = step(*args)
        if not self.view.passive and self.view.passive_max and len(self.view.active) < self.view.active_max:
            # Nothing left to repair from: take candidates from the replica, which knows every member.
            sends += self.view.offer(self._sample_known(self.config.passive_view))
        after = self.view.active
        if before != after:
            was, now = set(before), set(after)
            for peer in now - was:
                self._neighbour_up(peer)
            for peer in was - now:
                self._neighbour_down(peer)
        for peer, msg in sends:
            self._enqueue(peer, msg)

    def _neighbour_up(self, peer: PeerId) -> None:
        self.counters["neighbours_up"] += 1
        logger.debug("neighbour up", extra={"peer_id": peer})
        connections = getattr(self.host, "connections", None)
        if connections is not None:
            connections.protect(peer, PROTECT_TAG)
        for listener in list(self._up):
            listener(peer)

    def _neighbour_down(self, peer: PeerId) -> None:
        self.counters["neighbours_down"] += 1
        logger.debug("neighbour down", extra={"peer_id": peer})
        connections = getattr(self.host, "connections", None)
        if connections is not None:
            connections.unprotect(peer, PROTECT_TAG)
        for listener in list(self._down):
            listener(peer)

    def _peer_failed(self, peer: PeerId) -> None:
        was_active = self.view.is_active(peer)
        self._apply(self.view.failed, peer)
        if was_active:
            for listener in list(self._failed):
                listener(peer)

    def _on_disconnected(self, peer: PeerId) -> None:
        # Only a neighbour's connection matters: others are short-lived and closed on purpose.
        if self.view.is_active(peer):
            self._peer_failed(peer)

    def tick(self) -> None:
        """One shuffle period: top the passive view up from the replica, shuffle, repair."""
        room = self.config.passive_view - len(self.view.passive)
        if room > 0:
            self._apply(self.view.offer, self._sample_known(room))
        self._apply(self.view.tick)
        keep = set(self.view.active) | set(self.view.passive)
        self._book = {p: a for p, a in self._book.items() if p in keep}

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.shuffle_interval * (0.5 + self._rng.random()))
            self.tick()

    # --- the registry ---------------------------------------------------------------------------------------
    def _sample_known(self, k: int) -> list[PeerId]:
        """Up to `k` random live members in neither view."""
        pool = [p for p in self._known if not self.view.knows(p) and self._usable(p)]
        return self._rng.sample(pool, min(k, len(pool)))

    def _track(self, record: NodeRecord) -> bool:
        """Follow one record; True when its peer has no live session left."""
        peer = record.peer_id
        if peer == self.host.peer_id:
            return False
        sessions = self._sessions.setdefault(peer, set())
        if record.lifecycle <= Lifecycle.SERVING:
            sessions.add(record.session_id)
            self._known[peer] = record.addrs
            return False
        sessions.discard(record.session_id)
        if sessions:
            return False
        del self._sessions[peer]
        self._known.pop(peer, None)
        self._book.pop(peer, None)
        return True

    def _on_record(self, record: NodeRecord, local: bool) -> None:
        peer = record.peer_id
        if self._track(record):
            if self.view.knows(peer):
                self._apply(self.view.forget, peer)
        elif (
            peer in self._known
            and self.view.wants_peers()
            and not self.view.knows(peer)
            and self._usable(peer)
        ):
            self._apply(self.view.offer, [peer])

    # --- sending --------------------------------------------------------------------------------------------
    def _enqueue(self, peer: PeerId, msg: ViewMessage) -> None:
        self._outbox.setdefault(peer, []).append(msg)
        if peer not in self._sending:
            self._sending.add(peer)
            self._tasks.spawn(self._deliver(peer), "overlay-send")

    async def _deliver(self, peer: PeerId) -> None:
        """Send what is queued for `peer`, a batch at a time, each after the previous one was applied."""
        delivered = True
        try:
            while delivered and (batch := self._outbox.pop(peer, None)):
                if len(batch) > MAX_BATCH:
                    self._outbox[peer] = batch[MAX_BATCH:]
                    batch = batch[:MAX_BATCH]
                delivered = await self._send(peer, batch)
        finally:
            self._sending.discard(peer)
        if not delivered:
            self._outbox.pop(peer, None)
            self._peer_failed(peer)

    async def _send(self, peer: PeerId, batch: list[ViewMessage]) -> bool:
        payload = {"m": [self._encode(m) for m in batch]}
        timeout = self.config.gossip_timeout
        try:
            async with asyncio.timeout(timeout):
                stream = await self.host.open_stream(
                    peer, PROTO_VIEW, addrs=self.addrs_of(peer), timeout=timeout
                )
                try:
                    await write_msg(stream, payload, MAX_VIEW_MESSAGE)
                    reply = await read_msg(stream, MAX_VIEW_MESSAGE)
                finally:
                    await stream.aclose()
        except (OpenTelaError, TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            self.counters["send_failures"] += 1
            logger.debug("overlay message to %s failed: %r", peer, exc)
            return False
        self.counters["messages_sent"] += len(batch)
        return isinstance(reply, dict) and reply.get("ok") == 1

    def _encode(self, msg: ViewMessage) -> dict[str, Any]:
        out: dict[str, Any] = {"t": msg.kind.value}
        if msg.kind is Kind.JOIN:
            out["a"] = list(self.registry.local.addrs)
        if msg.peer:
            out["p"] = msg.peer
            if addrs := self.addrs_of(msg.peer):
                out["a"] = list(addrs)
        if msg.ttl:
            out["ttl"] = msg.ttl
        if msg.high:
            out["hi"] = 1
        if msg.sample:
            out["s"] = list(msg.sample)
        return out

    # --- serving --------------------------------------------------------------------------------------------
    async def rpc_view(self, stream: Stream) -> None:
        """Apply a batch of overlay messages from a peer, in order, then acknowledge it."""
        sender = stream.remote_peer
        try:
            raw = await read_msg(stream, MAX_VIEW_MESSAGE)
            items = raw.get("m") if isinstance(raw, dict) else None
            if not isinstance(items, list) or len(items) > MAX_BATCH:
                raise ProtocolError("an overlay batch is a map with a short list of messages")
            for item in items:
                parsed = _decode(item)
                if parsed is None:
                    self.counters["malformed"] += 1
                    continue
                msg, addrs = parsed
                about = sender if msg.kind is Kind.JOIN else msg.peer
                if addrs and about and about not in self._known:
                    self._book[about] = addrs
                if msg.sample:
                    # Only members this replica knows (and the shuffle's origin): made-up peer ids would crowd
                    # real candidates out of the passive view.
                    kept = tuple(p for p in msg.sample if p in self._known or p == msg.peer or p == sender)
                    msg = dataclasses.replace(msg, sample=kept)
                self.counters["messages_received"] += 1
                self._apply(self.view.receive, sender, msg)
            await write_msg(stream, {"ok": 1})
        except (OpenTelaError, asyncio.IncompleteReadError) as exc:
            self.counters["malformed"] += 1
            logger.debug("overlay batch from %s failed: %r", sender, exc)
        finally:
            with contextlib.suppress(OpenTelaError):
                await stream.aclose()


def _decode(raw: Any) -> tuple[ViewMessage, tuple[str, ...]] | None:
    """One message from the wire, and the addresses it carries; None when malformed."""
    if not isinstance(raw, dict):
        return None
    try:
        kind = Kind(raw.get("t"))
    except ValueError:
        return None
    peer = raw.get("p", "")
    ttl = raw.get("ttl", 0)
    sample = raw.get("s", [])
    addrs = raw.get("a", [])
    if not isinstance(peer, str) or (peer and not is_peer_id(peer)):
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_TTL:
        return None
    if not isinstance(sample, list) or len(sample) > MAX_SAMPLE:
        return None
    if not all(isinstance(p, str) and is_peer_id(p) for p in sample):
        return None
    if not isinstance(addrs, list) or len(addrs) > MAX_ADDRS:
        return None
    if not all(isinstance(a, str) and 0 < len(a) <= MAX_ADDR_TEXT for a in addrs):
        return None
    msg = ViewMessage(kind, peer=peer, ttl=ttl, high=raw.get("hi") == 1, sample=tuple(sample))
    return msg, tuple(addrs)
