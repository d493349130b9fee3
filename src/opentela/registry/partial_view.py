"""A HyParView-style partial view of the mesh as a pure state machine: a small active view and a larger passive one.

No I/O, no clock, no event loop: a driver (`overlay.py` over the fabric, or a simulator) hands every method the
messages that arrived and sends the `(recipient, message)` pairs each method returns. All randomness comes from
the injected `random.Random`, and views are insertion-ordered dicts, so a run is deterministic given its rng and
its inputs (set iteration would depend on string hashing).

Views. The *active view* (at most `active_max` peers) is symmetric: when A holds B, B holds A once the messages
in flight are delivered. Active peers are the ones a node keeps connections to, probes and floods changes over.
The *passive view* (at most `passive_max`) is a sample of other members, kept fresh by shuffles, from which the
active view is repaired; passive peers get no connection. The two are disjoint and never contain the node itself.

Messages (`ViewMessage.kind`; `peer` is the joiner or the shuffle's origin):
  JOIN           a new node -> its contact. The contact takes the joiner as a neighbour (making room if full) and
                 starts a FORWARD_JOIN walk of length `active_walk` through each of its other neighbours.
  FORWARD_JOIN   (peer = joiner, ttl) a random walk. Where it ends (ttl 0, or a node with no other neighbour) the
                 node takes the joiner as a neighbour; at ttl == `passive_walk` the node keeps it as passive.
  CONNECT        "I hold you in my active view": the receiver takes the sender too and answers CONNECT when it
                 did not already hold it. A node with a full view takes an unsolicited CONNECT only from a peer it
                 asked (NEIGHBOR); otherwise it answers DISCONNECT.
  DISCONNECT     "I dropped you": the receiver drops the sender from its active view and keeps it as passive.
  NEIGHBOR       (high) a request to become neighbours, sent to a passive peer to fill the active view: accepted
                 (answered CONNECT) when the receiver has room or when `high` (the sender has no neighbour left),
                 else answered REFUSE.
  REFUSE         a NEIGHBOR request turned down; the requester asks someone else after its next tick (at once,
                 with high priority, when it has no neighbour).
  SHUFFLE        (peer = origin, ttl, sample) a random walk of `shuffle_walk` hops carrying the origin and
                 `shuffle_active` + `shuffle_passive` of its peers; where it ends the node answers SHUFFLE_REPLY
                 straight to the origin with as many of its own passive peers, and both merge what they got into
                 their passive views.
  SHUFFLE_REPLY  (sample) the answer to a shuffle.
A walk (FORWARD_JOIN, SHUFFLE) arriving from a peer that is not our neighbour is answered with DISCONNECT: the
sender missed ours, or failed us after a timeout, and would otherwise keep a one-sided link.

Method contract: `join`, `receive`, `failed`, `forget`, `offer`, `tick` and `leave` each return the messages to
send. A driver must deliver the messages from one node to another in the order they were sent (as one
connection does), and call `failed(peer)` when a message to `peer` could not be delivered or its connection
broke; the view then stays symmetric once everything is delivered (the property tests check this). `tick` runs
one shuffle, asks passive peers to fill free slots and forgets stale requests: call it every shuffle interval.
`forget(peer)` drops a peer known to have left (the registry says so), `offer(peers)` adds members learned
elsewhere as passive candidates while there is room; neither sends anything to that peer. `failed` and
`forget` of an active peer start its replacement at once.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from dataclasses import dataclass

from opentela._types import PeerId

FAILED_TICKS = 3
"""Ticks a peer that could not be reached is left out of offers and shuffle samples."""


class Kind(enum.Enum):
    """The message types of the overlay protocol."""

    JOIN = "join"
    FORWARD_JOIN = "forward_join"
    CONNECT = "connect"
    DISCONNECT = "disconnect"
    NEIGHBOR = "neighbor"
    REFUSE = "refuse"
    SHUFFLE = "shuffle"
    SHUFFLE_REPLY = "shuffle_reply"


@dataclass(frozen=True, slots=True)
class ViewMessage:
    """One overlay message; the sender is whoever delivered it (the fabric authenticates it)."""

    kind: Kind
    peer: PeerId = ""
    """FORWARD_JOIN: the joiner; SHUFFLE: the origin."""
    ttl: int = 0
    high: bool = False
    sample: tuple[PeerId, ...] = ()


Send = tuple[PeerId, ViewMessage]
"""A message and its recipient."""

_JOIN = ViewMessage(Kind.JOIN)
_CONNECT = ViewMessage(Kind.CONNECT)
_DISCONNECT = ViewMessage(Kind.DISCONNECT)
_REFUSE = ViewMessage(Kind.REFUSE)
_NEIGHBOR_LOW = ViewMessage(Kind.NEIGHBOR)
_NEIGHBOR_HIGH = ViewMessage(Kind.NEIGHBOR, high=True)


class PartialView:
    """One node's active and passive views and the rules that keep them."""

    def __init__(
        self,
        me: PeerId,
        *,
        active_max: int = 6,
        passive_max: int = 30,
        active_walk: int = 6,
        passive_walk: int = 3,
        shuffle_walk: int = 3,
        shuffle_active: int = 3,
        shuffle_passive: int = 4,
        rng: random.Random | None = None,
    ) -> None:
        if active_max < 2 or passive_max < 0 or not 0 <= passive_walk <= active_walk:
            # One neighbour each would pair nodes off: never a connected graph, and an odd one out forever.
            raise ValueError("active_max >= 2, passive_max >= 0 and 0 <= passive_walk <= active_walk")
        self.me = me
        self.active_max = active_max
        self.passive_max = passive_max
        self.active_walk = active_walk
        self.passive_walk = passive_walk
        self.shuffle_walk = shuffle_walk
        self.shuffle_active = shuffle_active
        self.shuffle_passive = shuffle_passive
        self._rng = rng or random.Random()
        self._active: dict[PeerId, None] = {}
        self._passive: dict[PeerId, None] = {}
        self._pending: dict[PeerId, tuple[int, bool]] = {}  # asked NEIGHBOR -> (the tick, high priority)
        self._cooling: dict[PeerId, None] = {}  # refused or dropped us: not asked again before the next tick
        self._failed: dict[PeerId, int] = {}  # unreachable -> the tick it failed in
        self._sent: tuple[PeerId, ...] = ()  # our sample in the shuffle under way
        self._ticks = 0

    def __repr__(self) -> str:
        return (
            f"<PartialView {self.me[-8:]} active={len(self._active)}/{self.active_max}"
            f" passive={len(self._passive)}/{self.passive_max} pending={len(self._pending)}>"
        )

    # --- reads ----------------------------------------------------------------------------------------------
    @property
    def active(self) -> tuple[PeerId, ...]:
        """The active view, in the order the peers entered it."""
        return tuple(self._active)

    @property
    def passive(self) -> tuple[PeerId, ...]:
        """The passive view."""
        return tuple(self._passive)

    def is_active(self, peer: PeerId) -> bool:
        """Whether `peer` is in the active view."""
        return peer in self._active

    def knows(self, peer: PeerId) -> bool:
        """Whether `peer` is in either view."""
        return peer in self._active or peer in self._passive

    def wants_peers(self) -> bool:
        """Whether offers would be used: the active view has room, or the passive view does."""
        return len(self._active) < self.active_max or len(self._passive) < self.passive_max

    # --- events ---------------------------------------------------------------------------------------------
    def join(self, contact: PeerId) -> list[Send]:
        """Join the overlay through `contact`: it becomes our first neighbour and walks us into others' views."""
        out: list[Send] = []
        if contact == self.me:
            return out
        self._failed.pop(contact, None)
        self._add_active(contact, out)
        out.append((contact, _JOIN))
        return out

    def receive(self, sender: PeerId, msg: ViewMessage) -> list[Send]:
        """Handle one message from `sender`."""
        out: list[Send] = []
        if sender == self.me:
            return out
        self._failed.pop(sender, None)
        kind = msg.kind
        if kind is Kind.CONNECT:
            self._on_connect(sender, out)
        elif kind is Kind.DISCONNECT:
            if sender in self._active:
                del self._active[sender]
                self._add_passive(sender)
                self._cooling[sender] = None
                self._fill(out)
        elif kind is Kind.NEIGHBOR:
            self._on_neighbor(sender, msg.high, out)
        elif kind is Kind.REFUSE:
            self._pending.pop(sender, None)
            self._cooling[sender] = None
        elif kind is Kind.JOIN:
            if self._add_active(sender, out):
                out.append((sender, _CONNECT))
            walk = ViewMessage(Kind.FORWARD_JOIN, peer=sender, ttl=self.active_walk)
            out.extend((p, walk) for p in self._active if p != sender)
        elif kind is Kind.FORWARD_JOIN:
            self._heal(sender, out)
            self._on_forward_join(sender, msg, out)
        elif kind is Kind.SHUFFLE:
            self._heal(sender, out)
            self._on_shuffle(sender, msg, out)
        elif kind is Kind.SHUFFLE_REPLY:
            self._merge(msg.sample, self._sent)
            self._sent = ()
        if not self._active:
            self._fill(out)  # alone: never wait for the next tick while a candidate is known
        return out

    def failed(self, peer: PeerId) -> list[Send]:
        """A message to `peer` could not be delivered, or our connection to it broke.

        An active peer moves to the passive view, since a broken connection is no proof of death: the repair
        that follows may pick it again, and only when that fails too is it dropped for good.
        """
        out: list[Send] = []
        self._pending.pop(peer, None)
        if peer in self._active:
            del self._active[peer]
            self._add_passive(peer)
        else:
            self._passive.pop(peer, None)
            self._failed[peer] = self._ticks
        self._fill(out)
        return out

    def forget(self, peer: PeerId) -> list[Send]:
        """`peer` left the mesh (or was evicted): drop it from both views without a word to it."""
        out: list[Send] = []
        self._active.pop(peer, None)
        self._passive.pop(peer, None)
        self._pending.pop(peer, None)
        self._cooling.pop(peer, None)
        self._fill(out)
        return out

    def offer(self, peers: Iterable[PeerId]) -> list[Send]:
        """Members learned elsewhere (the registry): kept as passive while there is room, and used to fill.

        Only new candidates start requests: otherwise every node with a free slot would ask someone each time
        it learns of any member, and a joiner's record, flooded to all, would set off a request per node.
        """
        out: list[Send] = []
        before = len(self._passive)
        for peer in peers:
            if len(self._passive) >= self.passive_max:
                break
            if peer not in self._failed:
                self._add_passive(peer)
        if len(self._passive) > before:
            self._fill(out)
        return out

    def tick(self) -> list[Send]:
        """One period: forget stale requests and failures, start a shuffle, ask passive peers to fill the view."""
        out: list[Send] = []
        self._ticks += 1
        self._cooling.clear()
        for peer in [p for p, (asked, _) in self._pending.items() if asked < self._ticks - 1]:
            del self._pending[peer]  # its answer was lost
        for peer in [p for p, at in self._failed.items() if at < self._ticks - FAILED_TICKS]:
            del self._failed[peer]
        if self._active:
            target = self._rng.choice(list(self._active))
            others = [p for p in self._active if p != target]
            sample = (
                self.me,
                *self._rng.sample(others, min(self.shuffle_active, len(others))),
                *self._rng.sample(list(self._passive), min(self.shuffle_passive, len(self._passive))),
            )
            self._sent = sample
            out.append(
                (target, ViewMessage(Kind.SHUFFLE, peer=self.me, ttl=self.shuffle_walk, sample=sample))
            )
        self._fill(out)
        return out

    def leave(self) -> list[Send]:
        """Leave the overlay: tell every neighbour."""
        out: list[Send] = [(p, _DISCONNECT) for p in self._active]
        self._active.clear()
        self._pending.clear()
        return out

    # --- rules ----------------------------------------------------------------------------------------------
    def _on_connect(self, sender: PeerId, out: list[Send]) -> None:
        if sender in self._active:
            self._pending.pop(sender, None)
            return
        if len(self._active) >= self.active_max and sender not in self._pending:
            # Unsolicited and no room: say no, so the sender does not keep a one-sided link.
            out.append((sender, _DISCONNECT))
            self._add_passive(sender)
            return
        self._add_active(sender, out)
        out.append((sender, _CONNECT))

    def _on_neighbor(self, sender: PeerId, high: bool, out: list[Send]) -> None:
        if sender in self._active:
            out.append((sender, _CONNECT))  # it lost us; we did not lose it
        elif high or len(self._active) < self.active_max:
            self._add_active(sender, out)
            out.append((sender, _CONNECT))
        else:
            self._add_passive(sender)
            out.append((sender, _REFUSE))

    def _on_forward_join(self, sender: PeerId, msg: ViewMessage, out: list[Send]) -> None:
        joiner = msg.peer
        if not joiner or joiner == self.me:
            return
        if msg.ttl > 0 and len(self._active) > 1:
            if msg.ttl == self.passive_walk:
                self._add_passive(joiner)
            onward = [p for p in self._active if p != sender and p != joiner]
            if onward:
                step = ViewMessage(Kind.FORWARD_JOIN, peer=joiner, ttl=msg.ttl - 1)
                out.append((self._rng.choice(onward), step))
                return
        if self._add_active(joiner, out):
            out.append((joiner, _CONNECT))

    def _on_shuffle(self, sender: PeerId, msg: ViewMessage, out: list[Send]) -> None:
        origin = msg.peer
        if not origin or origin == self.me:
            return
        if msg.ttl > 0 and len(self._active) > 1:
            onward = [p for p in self._active if p != sender and p != origin]
            if onward:
                step = ViewMessage(Kind.SHUFFLE, peer=origin, ttl=msg.ttl - 1, sample=msg.sample)
                out.append((self._rng.choice(onward), step))
                return
        pool = [p for p in self._passive if p != origin and p not in self._failed]
        reply = tuple(self._rng.sample(pool, min(len(msg.sample), len(pool))))
        out.append((origin, ViewMessage(Kind.SHUFFLE_REPLY, sample=reply)))
        self._merge(msg.sample, reply)

    def _heal(self, sender: PeerId, out: list[Send]) -> None:
        # Only a neighbour sends walks; a sender that still counts us as one after we dropped it (a lost
        # DISCONNECT, a timeout that failed it here) is told again.
        if sender not in self._active:
            out.append((sender, _DISCONNECT))

    def _merge(self, sample: Iterable[PeerId], sent: tuple[PeerId, ...]) -> None:
        """Take a shuffle sample into the passive view, making room from what we sent away first."""
        spare = [p for p in sent if p in self._passive]
        for peer in sample:
            if peer == self.me or peer in self._active or peer in self._passive or peer in self._failed:
                continue
            if self.passive_max == 0:
                return
            if len(self._passive) >= self.passive_max:
                victim = spare.pop() if spare else self._rng.choice(list(self._passive))
                del self._passive[victim]
            self._passive[peer] = None

    def _add_active(self, peer: PeerId, out: list[Send]) -> bool:
        """Take `peer` as a neighbour, dropping a random one (told DISCONNECT) when full; False if already held."""
        if peer == self.me or peer in self._active:
            return False
        self._passive.pop(peer, None)
        self._pending.pop(peer, None)
        self._cooling.pop(peer, None)
        if len(self._active) >= self.active_max:
            victim = self._rng.choice(list(self._active))
            del self._active[victim]
            out.append((victim, _DISCONNECT))
            self._add_passive(victim)
        self._active[peer] = None
        return True

    def _add_passive(self, peer: PeerId) -> None:
        if peer == self.me or peer in self._active or peer in self._passive or self.passive_max == 0:
            return
        if len(self._passive) >= self.passive_max:
            del self._passive[self._rng.choice(list(self._passive))]
        self._passive[peer] = None

    def _fill(self, out: list[Send]) -> None:
        """Ask passive peers to become neighbours while the active view has room.

        With no neighbour at all, one request of high priority (it must be accepted); otherwise low-priority
        requests, taken only by peers with room, so a full mesh of N <= active_max nodes forms by itself.
        """
        if not self._passive:
            return
        if not self._active:
            if any(high for _, high in self._pending.values()):
                return  # one is out already; a second would force two peers to make room at once
            # Even a peer that just dropped or refused us: a high-priority request is always accepted.
            candidates = [p for p in self._passive if p not in self._pending]
            if candidates:
                peer = self._rng.choice(candidates)
                self._pending[peer] = (self._ticks, True)
                out.append((peer, _NEIGHBOR_HIGH))
            return
        free = self.active_max - len(self._active) - len(self._pending)
        candidates = [p for p in self._passive if p not in self._pending and p not in self._cooling]
        if free <= 0 or not candidates:
            return
        for peer in self._rng.sample(candidates, min(free, len(candidates))):
            self._pending[peer] = (self._ticks, False)
            out.append((peer, _NEIGHBOR_LOW))
