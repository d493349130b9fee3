"""SWIM failure detection as a pure state machine: probe order, suspicion, incarnations, dissemination, eviction.

No I/O and no clock of its own: the driver (`membership.py`) carries the messages and passes `now` in, so every
rule here is testable without an event loop. Members are sessions (registry keys) of other nodes whose record is
JOIN or SERVING. Nothing here enters the CRDT: suspicion and incarnations travel on probe messages only; the one
irreversible act, eviction, is the driver writing a LEFT record once `due_evictions` names a session.

Precedence of news about one session (SWIM, section 4.2 of the paper): the greater (incarnation, status) wins,
with SUSPECT > ALIVE at equal incarnation. So a suspicion overrides an alive claim of the same incarnation, and only
the suspected node itself, by raising its incarnation, can override a suspicion. Taking the maximum makes the order
in which news arrives irrelevant (`tests/property/test_swim_laws.py`).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from opentela._types import PeerId, SessionId

MAX_INCARNATION = 2**62


class Status(enum.IntEnum):
    """What a piece of news says about a session."""

    ALIVE = 0
    SUSPECT = 1


@dataclass(frozen=True, slots=True)
class Update:
    """News about one session: it is alive, or suspected, at `incarnation`."""

    status: Status
    session: SessionId
    incarnation: int

    @property
    def precedence(self) -> tuple[int, int]:
        """What decides between two updates about one session: the greater wins."""
        return (self.incarnation, int(self.status))

    def to_wire(self) -> list[Any]:
        """[status, session, incarnation]: a few dozen bytes."""
        return [int(self.status), self.session, self.incarnation]

    @classmethod
    def from_wire(cls, obj: Any) -> Update:
        """Parse untrusted input; ValueError when malformed."""
        if not (isinstance(obj, list | tuple) and len(obj) == 3):
            raise ValueError("a membership update is [status, session, incarnation]")
        status, session, incarnation = obj
        if status not in (0, 1) or isinstance(status, bool):
            raise ValueError(f"unknown membership status {status!r}")
        if not isinstance(session, str) or not 0 < len(session) <= 128:
            raise ValueError("membership update session must be a short string")
        if (
            isinstance(incarnation, bool)
            or not isinstance(incarnation, int)
            or not 0 <= incarnation < MAX_INCARNATION
        ):
            raise ValueError("membership update incarnation must be a non-negative integer")
        return cls(Status(status), session, incarnation)


@dataclass(slots=True)
class Member:
    """Another node's session as this node sees it."""

    session: SessionId
    peer: PeerId
    incarnation: int = 0
    status: Status = Status.ALIVE
    suspected_at: float | None = None
    witnessed: bool = False
    """True when our own probes failed; False when we only heard of the suspicion from others."""

    @property
    def precedence(self) -> tuple[int, int]:
        """The (incarnation, status) this member is at."""
        return (self.incarnation, int(self.status))


ChangeListener = Callable[[Member], None]


class SwimState:
    """One node's membership table and its pending news."""

    def __init__(
        self,
        session: SessionId,
        *,
        suspicion_timeout: float,
        retransmit_mult: int = 3,
        rng: random.Random | None = None,
    ) -> None:
        self.session = session
        self.incarnation = 0
        self.suspicion_timeout = suspicion_timeout
        self.retransmit_mult = retransmit_mult
        self.members: dict[SessionId, Member] = {}
        self._rng = rng or random.Random()
        self._order: list[SessionId] = []  # the rest of this round robin, popped from the end
        self._in_round: set[SessionId] = set()  # every session this round holds or held
        self._news: dict[SessionId, tuple[Update, int]] = {}  # update, transmissions left
        self._listeners: list[ChangeListener] = []
        self.refutations = 0

    def __repr__(self) -> str:
        suspected = sum(1 for m in self.members.values() if m.status is Status.SUSPECT)
        return (
            f"<SwimState {self.session[:8]} inc={self.incarnation} members={len(self.members)}"
            f" suspected={suspected}>"
        )

    def on_change(self, listener: ChangeListener) -> None:
        """Called with the member whenever it becomes suspected or alive again."""
        self._listeners.append(listener)

    # --- the member list ----------------------------------------------------------------------------------
    def sync(self, live: Mapping[SessionId, PeerId]) -> None:
        """Make the members exactly the `live` sessions (other than ours), keeping what we know of each."""
        for session in [s for s in self.members if s not in live]:
            self.remove(session)
        for session, peer in live.items():
            if session != self.session and session not in self.members:
                self.add(session, peer)

    def add(self, session: SessionId, peer: PeerId) -> Member:
        """A new member; it joins the running round robin at a random place rather than waiting for the next."""
        # SWIM (Das et al., section 4.3) inserts a newcomer at a uniformly random position of the current round:
        # appended to the next round, a node that joined early in a full mesh's N-period round could crash and
        # stay unprobed for up to N periods, far beyond the detection bound.
        member = self.members[session] = Member(session, peer)
        if self._order:
            self._order.insert(self._rng.randrange(len(self._order) + 1), session)
            self._in_round.add(session)
        return member

    def remove(self, session: SessionId) -> None:
        """Forget a session (it left, went down or was evicted)."""
        self.members.pop(session, None)
        self._news.pop(session, None)

    def next_target(self, among: Collection[SessionId] | None = None) -> Member | None:
        """The next member to probe: a shuffled round robin, so every member is probed once per N rounds.

        With `among` (the sessions of our partial view's neighbours), only those members are probed.
        """
        if among is not None and self._order:
            # A session that entered `among` during the round (a new neighbour) joins it as a newcomer would.
            for session in among:
                if session not in self._in_round and session in self.members:
                    self._order.insert(self._rng.randrange(len(self._order) + 1), session)
                    self._in_round.add(session)
        while True:
            if not self._order:
                self._order = [s for s in self.members if among is None or s in among]
                self._rng.shuffle(self._order)
                self._in_round = set(self._order) if among is not None else set()
                if not self._order:
                    return None
            session = self._order.pop()
            member = self.members.get(session)
            if member is not None and (among is None or session in among):
                return member

    def helpers(self, target: Member, k: int, among: Collection[SessionId] | None = None) -> list[Member]:
        """Up to `k` random unsuspected members on other nodes than `target`, to probe it on our behalf.

        With `among`, only those members (our neighbours, to whom we hold connections) are asked.
        """
        pool = [
            m
            for m in self.members.values()
            if m.status is Status.ALIVE
            and m.peer != target.peer
            and m.session != target.session
            and (among is None or m.session in among)
        ]
        by_peer = {m.peer: m for m in pool}
        return self._rng.sample(sorted(by_peer.values(), key=lambda m: m.session), min(k, len(by_peer)))

    def suspected(self) -> list[Member]:
        """Members currently suspected."""
        return [m for m in self.members.values() if m.status is Status.SUSPECT]

    def is_suspected(self, session: SessionId) -> bool:
        """Whether routing should avoid `session`."""
        member = self.members.get(session)
        return member is not None and member.status is Status.SUSPECT

    # --- news -------------------------------------------------------------------------------------------------
    def apply(self, update: Update, now: float, *, witnessed: bool = False) -> bool:
        """Take in news about a session; True when it changed what we believe."""
        if update.session == self.session:
            return self._about_us(update)
        member = self.members.get(update.session)
        if member is None or update.precedence <= member.precedence:
            return False
        was = member.status
        member.incarnation, member.status = update.incarnation, update.status
        if update.status is Status.SUSPECT:
            if was is not Status.SUSPECT:
                member.suspected_at, member.witnessed = now, witnessed
            else:
                member.witnessed = member.witnessed or witnessed
        else:
            member.suspected_at, member.witnessed = None, False
        self._spread(update)
        if member.status is not was:
            for listener in self._listeners:
                listener(member)
        return True

    def _about_us(self, update: Update) -> bool:
        # Someone suspects us at our incarnation or later: refute by outbidding it.
        if update.status is Status.SUSPECT and update.incarnation >= self.incarnation:
            self.incarnation = update.incarnation + 1
            self.refutations += 1
            self._spread(Update(Status.ALIVE, self.session, self.incarnation))
            return True
        return False

    def probe_failed(self, session: SessionId, now: float) -> bool:
        """Every probe path to `session` failed: suspect it at the incarnation we know."""
        member = self.members.get(session)
        if member is None:
            return False
        if member.status is Status.SUSPECT:
            member.witnessed = True
            return False
        return self.apply(Update(Status.SUSPECT, session, member.incarnation), now, witnessed=True)

    def acked(self, session: SessionId, incarnation: int, now: float) -> bool:
        """`session` answered a probe, reporting `incarnation`; only a raised incarnation lifts a suspicion."""
        return self.apply(Update(Status.ALIVE, session, incarnation), now)

    def _spread(self, update: Update) -> None:
        n = len(self.members) + 1
        self._news[update.session] = (update, self.retransmit_mult * max(1, math.ceil(math.log2(n + 1))))

    def piggyback(self, recipient: SessionId | None, limit: int) -> list[Update]:
        """News to carry on a message to `recipient`, freshest first; a suspicion of the recipient always rides.

        The recipient is the one node that can refute a suspicion of itself, so it hears of one whenever it talks
        to someone who holds it, however long ago the suspicion stopped being spread.
        """
        out: list[Update] = []
        member = self.members.get(recipient) if recipient else None
        told = member is not None and member.status is Status.SUSPECT
        if member is not None and told:
            out.append(Update(Status.SUSPECT, member.session, member.incarnation))
        ranked = sorted(self._news.items(), key=lambda kv: -kv[1][1])
        for session, (update, left) in ranked:
            if len(out) >= limit:
                break
            if told and session == recipient:
                continue
            out.append(update)
            if left <= 1:
                del self._news[session]
            else:
                self._news[session] = (update, left - 1)
        return out

    def pending_news(self) -> int:
        """Updates still being spread."""
        return len(self._news)

    # --- eviction ---------------------------------------------------------------------------------------------
    def due_evictions(self, now: float) -> list[Member]:
        """Suspected members whose grace period is over.

        A member we suspect first-hand is due after `suspicion_timeout`; one we only heard about after twice
        that, so usually one node (the witness) writes the eviction and the rest merely receive it.
        """
        out = []
        for member in self.members.values():
            if member.status is Status.SUSPECT and member.suspected_at is not None:
                grace = self.suspicion_timeout * (1 if member.witnessed else 2)
                if now - member.suspected_at >= grace:
                    out.append(member)
        return out

    def restart(self, session: SessionId) -> None:
        """We rejoined under a new session: start over with a fresh incarnation."""
        self.session = session
        self.incarnation = 0
        self.members.pop(session, None)
        self._news.clear()
