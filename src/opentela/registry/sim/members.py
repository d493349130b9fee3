"""SWIM member tables for ten thousand nodes: the real `SwimState`, with a member map that shares its roster.

In a full mesh every node's `SwimState.members` holds every other session: 10^8 `Member`s at 10,000 nodes. Almost
all of them are never touched in a simulated minute (a node probes one member a second), so `RosterMembers` keeps
one roster shared by every node and materializes a node's `Member` the first time its SWIM state looks it up; a
member that only ever is iterated over (SWIM's `helpers`) is built on the fly and dropped. Every read and write
SwimState makes goes through the mapping methods below, so the state machine runs unchanged.

`TrackedSwim` narrows the scans the real class makes once a protocol period over every member: `due_evictions`
and `suspected` run the same code over the members known to be suspected (tracked from the state's own change
listener), and `next_target(among)` and `helpers(..., among)` over the members in `among` (a partial view's
neighbours); each returns what the unnarrowed call would.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection, Iterator, MutableMapping, MutableSequence
from typing import Any, cast

import numpy as np

from opentela._types import PeerId, SessionId
from opentela.registry.swim import Member, Status, SwimState


class RosterMembers(MutableMapping[SessionId, Member]):
    """One node's member map over a roster (session -> peer) that many nodes share."""

    __slots__ = ("_added", "_excluded", "_extra", "_own", "_removed", "_roster")

    def __init__(self, roster: dict[SessionId, PeerId], own: SessionId) -> None:
        self._roster = roster
        self._own = own
        self._added: dict[SessionId, Member] = {}
        self._removed: set[SessionId] = set()
        self._excluded: set[SessionId] = {own}  # removed, and our own session: skipped when iterating
        self._extra = 0  # added sessions that are not in the roster

    def __repr__(self) -> str:
        return f"<RosterMembers {len(self)} ({len(self._added)} materialized)>"

    def _in_roster(self, session: SessionId) -> bool:
        return session in self._roster and session != self._own and session not in self._removed

    def __getitem__(self, session: SessionId) -> Member:
        member = self._added.get(session)
        if member is not None:
            return member
        if not self._in_roster(session):
            raise KeyError(session)
        member = self._added[session] = Member(session, self._roster[session])
        return member

    def get(self, session: SessionId, default: Member | None = None) -> Member | None:  # type: ignore[override]
        member = self._added.get(session)
        if member is not None:
            return member
        if not self._in_roster(session):
            return default
        member = self._added[session] = Member(session, self._roster[session])
        return member

    def __contains__(self, session: object) -> bool:
        return session in self._added or self._in_roster(cast(SessionId, session))

    def __setitem__(self, session: SessionId, member: Member) -> None:
        if session not in self._added and not self._in_roster(session) and session not in self._roster:
            self._extra += 1
        self._removed.discard(session)
        if session != self._own:
            self._excluded.discard(session)
        self._added[session] = member

    def __delitem__(self, session: SessionId) -> None:
        found = self._added.pop(session, None) is not None
        if session in self._roster and session != self._own:
            if session not in self._removed:
                self._removed.add(session)
                self._excluded.add(session)
                found = True
        elif found:
            self._extra -= 1
        if not found:
            raise KeyError(session)

    def __len__(self) -> int:
        base = len(self._roster) - (self._own in self._roster) - len(self._removed)
        return base + self._extra

    def __iter__(self) -> Iterator[SessionId]:
        # C-level iteration: this runs over 10,000 sessions whenever a node starts a new round robin.
        return itertools.chain(
            itertools.filterfalse(self._excluded.__contains__, self._roster),
            itertools.filterfalse(self._roster.__contains__, self._added),
        )

    def values(self) -> Iterator[Member]:  # type: ignore[override]
        added, roster = self._added, self._roster
        for session in self:
            member = added.get(session)
            yield member if member is not None else Member(session, roster[session])


class FastShuffle(random.Random):
    """A `random.Random` whose `shuffle` draws the permutation in NumPy: still uniform, 20 times faster.

    A full-mesh node shuffles all its members once per round robin; 10,000 nodes doing it with the pure-Python
    shuffle would spend a minute of the simulation's time there.
    """

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self._np = np.random.default_rng(seed)

    def shuffle(self, x: MutableSequence[Any]) -> None:
        if len(x) < 64:
            super().shuffle(x)
            return
        items = list(x)
        x[:] = [items[i] for i in self._np.permutation(len(items))]


class TrackedSwim(SwimState):
    """`SwimState` that knows which members are suspected without scanning them all."""

    def __init__(
        self, session: SessionId, *, suspicion_timeout: float, retransmit_mult: int, rng: random.Random
    ) -> None:
        super().__init__(
            session, suspicion_timeout=suspicion_timeout, retransmit_mult=retransmit_mult, rng=rng
        )
        self.suspects: set[SessionId] = set()
        self.on_suspect: Callable[[SessionId], None] | None = None
        """Told each session this state starts to suspect (routing avoids it from then on)."""
        self.on_change(self._track)

    def _track(self, member: Member) -> None:
        if member.status is Status.SUSPECT:
            self.suspects.add(member.session)
            if self.on_suspect is not None:
                self.on_suspect(member.session)
        else:
            self.suspects.discard(member.session)

    def use_roster(self, roster: dict[SessionId, PeerId]) -> None:
        """Make every roster session (but ours) a member, sharing the roster instead of copying it."""
        # A duck-typed dict: SwimState only uses the mapping methods RosterMembers implements.
        self.members = cast("dict[SessionId, Member]", RosterMembers(roster, self.session))

    def remove(self, session: SessionId) -> None:
        super().remove(session)
        self.suspects.discard(session)

    def _narrowed(self) -> dict[SessionId, Member]:
        members = self.members
        # Sorted: a set of strings iterates in an order that changes with PYTHONHASHSEED, and a run must be a
        # pure function of its seed.
        live = sorted(s for s in self.suspects if s in members)
        self.suspects.intersection_update(live)
        return {s: members[s] for s in live}

    def due_evictions(self, now: float) -> list[Member]:
        if not self.suspects:
            return []
        full, self.members = self.members, self._narrowed()
        try:
            return super().due_evictions(now)
        finally:
            self.members = full

    def next_target(self, among: Collection[SessionId] | None = None) -> Member | None:
        if among is None:
            return super().next_target()
        # Only members in `among` can come out: hand the real method just those (a few neighbours' sessions
        # instead of every member of a 10,000-node mesh); the shuffled round robin over them is the same.
        full, self.members = self.members, {s: m for s in among if (m := self.members.get(s)) is not None}
        try:
            return super().next_target(among)
        finally:
            self.members = full

    def helpers(self, target: Member, k: int, among: Collection[SessionId] | None = None) -> list[Member]:
        if among is None:
            return super().helpers(target, k)
        full, self.members = self.members, {s: m for s in among if (m := self.members.get(s)) is not None}
        try:
            return super().helpers(target, k, among)
        finally:
            self.members = full

    def suspected(self) -> list[Member]:
        if not self.suspects:
            return []
        full, self.members = self.members, self._narrowed()
        try:
            return super().suspected()
        finally:
            self.members = full
