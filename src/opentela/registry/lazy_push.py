"""Lazy push over the active view (after Plumtree): records go along a tree of eager links, ids over the rest.

Flooding sends every change over every active-view link, so each node receives each record once from every
neighbour that got it before us (about six times with six neighbours). Here each node splits its neighbours in
two: *eager* ones get the records, *lazy* ones only their ids ("I have version V of key K"). Every link starts
eager. A push that brings nothing new is answered with a prune, and both ends then treat that link as lazy, so
the eager links thin out to about a spanning tree: each record then crosses each link once, as a record on
tree links and as a few dozen bytes of id on the others. A node told of an id it lacks waits `graft_timeout`
for the record to come along the tree, then grafts: it asks an announcer for the record, which also makes that
link eager again. That repairs the tree where a node crashed or prunes on both sides of a node cut it off.

Records of the lifecycles in `FLOODED` skip all this and go to every neighbour as before. Only peers that have
shown they understand ids and prunes (`learned`) are ever made lazy: a node that predates lazy push never hears
of it and gets every record, as before. This module is pure state (no I/O, no clock): the gossip driver and the
simulator give it the time and do the sending. It is generic over how the caller names peers, keys and ranks
(the driver: peer ids, session ids and (lifecycle, version); the simulator: integers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from opentela._types import Lifecycle

GRAFT_TIMEOUT = 0.5
"""Seconds an announced id may go without its record arriving before the record is asked of the announcer. A
record that takes the tree lags its id by the tree's detour, a few link delays; much shorter and a slow tree
branch would be grafted around all the time (costing a record and a prune each), much longer and a node cut off
from the tree waits that long for every change."""
RETRY_TIMEOUT = 0.25
"""Seconds before the next announcer is asked, when a graft brought nothing."""
PRUNE_REPEAT = 5.0
"""Seconds before a peer that keeps pushing duplicates after our prune is told again (the prune may be lost)."""
MAX_MISSING = 4096
"""Announced keys tracked at once; past it new announcements are ignored (anti-entropy still repairs)."""
FLOODED = frozenset({int(Lifecycle.JOIN), int(Lifecycle.DOWN), int(Lifecycle.LEFT)})
"""Lifecycles whose records are flooded over every link as before, eager or lazy, and never judged for pruning:
JOIN (a new session: join convergence is what a new node waits on, and a tree path through loaded nodes is
several times slower than the first of six copies), DOWN and LEFT (they take a replica out of routing, matter
most where the tree is broken, a crashed node having been part of it, and are the smallest records). What goes
lazily is every SERVING version: model announcements, state changes and hourly refreshes."""


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


P = TypeVar("P", bound=Hashable)
K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=_Ordered)


@dataclass
class Missing(Generic[P, R]):
    """A key announced to us at a rank we do not hold: who announced it, and when to ask for it."""

    rank: R
    announcers: list[P]
    due: float


@dataclass
class LazyPush(Generic[P, K, R]):
    """Which neighbours get records and which only ids, and the announced records we are waiting for."""

    graft_timeout: float = GRAFT_TIMEOUT
    retry_timeout: float = RETRY_TIMEOUT
    prune: bool = True
    """Whether this node prunes links that bring duplicates (False: it floods, though it still honours the prunes
    and grafts of others)."""
    max_missing: int = MAX_MISSING
    flood: frozenset[int] = FLOODED
    """Lifecycles whose records go to every neighbour as records, lazy ones included."""
    """Lifecycle from which records are flooded to lazy neighbours too (None: none are)."""
    neighbours: set[P] = field(default_factory=set)
    capable: set[P] = field(default_factory=set)
    """Neighbours known to understand ids, prunes and grafts."""
    lazy: set[P] = field(default_factory=set)
    """Neighbours that get ids instead of records (always a subset of `capable`)."""
    missing: dict[K, Missing[P, R]] = field(default_factory=dict)
    counters: Counter[str] = field(default_factory=Counter)
    _pruned_at: dict[P, float] = field(default_factory=dict)

    # --- the active view ------------------------------------------------------------------------------------
    def neighbour_up(self, peer: P) -> None:
        """A peer entered the active view: its link starts eager."""
        self.neighbours.add(peer)
        self.lazy.discard(peer)

    def neighbour_down(self, peer: P) -> list[P]:
        """A peer left the active view: forget what we knew of it (it may come back as an older node).

        When its link was eager, the tree may be cut here: a record from beyond the cut would come to this side
        only as an id and wait out the graft timeout. So every remaining link turns eager on our side, and the
        peers returned (our lazy neighbours) are to be asked, by a graft naming no key, to turn theirs eager too.
        The next record then floods around this node, and the prunes it draws re-form a tree across the cut.
        """
        was_eager = peer in self.neighbours and peer not in self.lazy
        self.neighbours.discard(peer)
        self.capable.discard(peer)
        self.lazy.discard(peer)
        self._pruned_at.pop(peer, None)
        if not was_eager or not self.lazy:
            return []
        reeager = sorted(self.lazy, key=str)  # in a fixed order: the simulator's runs follow their seed alone
        self.lazy.clear()
        self.counters["reeagered"] += len(reeager)
        return reeager

    def learned(self, peer: P) -> None:
        """`peer` showed it understands ids (it sent one, a prune, a graft, or said so in anti-entropy)."""
        if peer in self.neighbours:
            self.capable.add(peer)

    def is_lazy(self, peer: P) -> bool:
        """Whether `peer` gets ids instead of records."""
        return peer in self.lazy

    def flooded(self, lifecycle: int) -> bool:
        """Whether a record at `lifecycle` goes to every neighbour as a record, lazy ones included. Such records
        say nothing about the tree: a push of nothing but them is never judged a duplicate."""
        return lifecycle in self.flood

    # --- what arrives -----------------------------------------------------------------------------------
    def received(self, peer: P, fresh: bool, now: float) -> bool:
        """A push of records from `peer`; `fresh`: some of them were newer than our replica. True when we
        should tell `peer` to prune the link (send us ids from now on)."""
        if fresh:
            self.lazy.discard(peer)  # it is our way to those records: keep pushing to it too
            return False
        self.counters["duplicates"] += 1
        if not self.prune or peer not in self.capable:
            return False
        if peer in self.lazy and now - self._pruned_at.get(peer, -PRUNE_REPEAT) < PRUNE_REPEAT:
            return False
        self.lazy.add(peer)
        self._pruned_at[peer] = now
        self.counters["prunes_sent"] += 1
        return True

    def pruned(self, peer: P) -> None:
        """`peer` asked for ids instead of records."""
        self.learned(peer)
        if peer in self.capable:
            self.lazy.add(peer)
            self.counters["prunes_received"] += 1

    def grafted(self, peer: P) -> None:
        """`peer` asked us for records it was told of: its link is eager again."""
        self.learned(peer)
        self.lazy.discard(peer)
        self.counters["grafts_received"] += 1

    def announced(self, peer: P, key: K, rank: R, ours: R | None, now: float) -> bool:
        """`peer` holds `key` at `rank`; we hold `ours` (None: nothing). True when this starts a wait, due
        `graft_timeout` from now."""
        self.learned(peer)
        self.counters["ids_received"] += 1
        if ours is not None and not ours < rank:
            return False
        wait = self.missing.get(key)
        if wait is None:
            if len(self.missing) >= self.max_missing:
                return False
            self.missing[key] = Missing(rank, [peer], now + self.graft_timeout)
            return True
        if wait.rank < rank:
            wait.rank = rank
        if peer not in wait.announcers:
            wait.announcers.append(peer)
        return False

    def arrived(self, key: K, rank: R) -> None:
        """A record of `key` at `rank` reached us (applied or not): stop waiting for it if that is enough."""
        wait = self.missing.get(key)
        if wait is not None and not rank < wait.rank:
            del self.missing[key]

    # --- grafting ---------------------------------------------------------------------------------------
    def next_due(self) -> float | None:
        """When the earliest wait runs out (None: we wait for nothing)."""
        return min((w.due for w in self.missing.values()), default=None)

    def due(self, now: float) -> dict[P, list[K]]:
        """The grafts to send now: for each record waited for too long, its next announcer still a neighbour.
        Each asked announcer's link becomes eager; a wait with no announcer left is dropped."""
        grafts: dict[P, list[K]] = {}
        for key, wait in list(self.missing.items()):
            if wait.due > now:
                continue
            while wait.announcers and wait.announcers[0] not in self.neighbours:
                wait.announcers.pop(0)
            if not wait.announcers:
                del self.missing[key]
                continue
            peer = wait.announcers.pop(0)
            grafts.setdefault(peer, []).append(key)
            self.lazy.discard(peer)
            wait.due = now + self.retry_timeout
        self.counters["grafts_sent"] += len(grafts)
        return grafts
