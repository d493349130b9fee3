"""A joiner's first full sync, split by key hash over its first neighbours instead of pulled whole from its contact.

A node that joins through a bootstrap peer used to pull the whole registry from it (0.9 MB at 1,000 nodes), so
every join in the mesh landed on the few bootstrap peers. The plan below splits the registry's keys into
`shards` classes by a stable hash and asks each new neighbour for one class; the contact we joined through is
asked only if no other neighbour turns up within `wait` seconds. Pure state: the gossip driver (and the
simulator) call it and do the I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opentela._types import PeerId


def shard_of(key: str, shards: int) -> int:
    """The class `key` falls in: a stable hash, the same on every node and every Python run."""
    return zlib.crc32(key.encode()) % shards if shards > 1 else 0


@dataclass
class JoinSync:
    """Which neighbour is pulling which shard of the registry, and which shards are still missing."""

    shards: int
    wait: float
    contacts: frozenset[PeerId] = frozenset()
    started: float | None = None
    todo: set[int] = field(default_factory=set)
    pulling: dict[PeerId, tuple[int, ...]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    failed: set[PeerId] = field(default_factory=set)
    """Peers whose last pull failed or who are still syncing themselves: asked again only if nobody else is."""

    def __post_init__(self) -> None:
        self.todo = set(range(max(1, self.shards))) - self.done

    @property
    def complete(self) -> bool:
        """Every shard arrived."""
        return len(self.done) >= max(1, self.shards)

    def expired(self, now: float) -> bool:
        """Whether the wait for non-contact neighbours is over."""
        return self.started is not None and now - self.started >= self.wait

    def on_neighbour(self, peer: PeerId, now: float) -> tuple[int, ...]:
        """A neighbour came up: the shards to pull from it now (none from a contact before the wait is over)."""
        if self.started is None:
            self.started = now
        if self.complete or peer in self.pulling or not self.todo or peer in self.failed:
            return ()
        if peer in self.contacts and not self.expired(now):
            return ()
        return self._assign(peer, (min(self.todo),))

    def reassign(self, neighbours: Sequence[PeerId], now: float) -> dict[PeerId, tuple[int, ...]]:
        """After the wait: spread the unassigned shards over the idle members of the best tier of neighbours:
        other peers, else the contacts, else those whose last pull failed."""
        if self.complete or not self.todo or not self.expired(now):
            return {}
        # The best tier with anyone in it: its busy members finish first rather than the next tier stepping in
        # (a contact asked while other neighbours are merely busy is the load this plan exists to avoid).
        tiers = (
            [p for p in neighbours if p not in self.contacts and p not in self.failed],
            [p for p in neighbours if p in self.contacts and p not in self.failed],
            [p for p in neighbours if p in self.failed],
        )
        best = next((tier for tier in tiers if tier), [])
        idle = [p for p in best if p not in self.pulling]
        if not idle:
            return {}
        plan: dict[PeerId, list[int]] = {}
        for i, shard in enumerate(sorted(self.todo)):
            plan.setdefault(idle[i % len(idle)], []).append(shard)
        return {peer: self._assign(peer, tuple(shards)) for peer, shards in plan.items()}

    def finished(self, peer: PeerId, ok: bool) -> None:
        """The pull from `peer` ended: its shards arrived, or (it failed, or the peer is still syncing itself)
        they go back to be asked of someone else."""
        shards = self.pulling.pop(peer, ())
        if ok:
            self.done.update(shards)
            self.failed.discard(peer)
        else:
            self.todo.update(s for s in shards if s not in self.done)
            self.failed.add(peer)

    def _assign(self, peer: PeerId, shards: Iterable[int]) -> tuple[int, ...]:
        chosen = tuple(shards)
        self.todo.difference_update(chosen)
        self.pulling[peer] = chosen
        return chosen
