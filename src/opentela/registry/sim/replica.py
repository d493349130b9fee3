"""Every simulated node's registry replica, held compactly: a shared base plus what each node has that differs.

Ten thousand full replicas of ten thousand records are 10^8 entries, too many for dictionaries of records. What
the simulation needs of a record is its key and its rank, so a replica here is a map session index -> rank, where
rank = lifecycle << 32 | version orders exactly as `NodeRecord.rank` ((lifecycle, version)) does, and the merge
is `crdt.merge`'s: the greater rank wins, a lifecycle never goes back. (Equal ranks with different content, which
only concurrent evictions of one session produce, are taken as equal here; the real map settles them by the
signed bytes, one extra push per replica that held the other.) Nodes that were present at the warm start share
one `base` array and keep only their differences from it; a node that joins later starts from nothing.

Digest equality (`gossip.digest_hash`) is an order-independent 64-bit fingerprint kept up to date on each apply,
so an anti-entropy round that finds nothing to do costs O(1) here, as a 16-byte hash compare does there.
"""

from __future__ import annotations

from collections.abc import Callable

from opentela._types import Lifecycle

UNKNOWN = -1
_MASK = (1 << 64) - 1
_SHIFT = 32

ApplyListener = Callable[[int, int, int, int], None]
"""Called with (node, session, old rank, new rank) after a rank changed a replica."""


def rank_of(lifecycle: Lifecycle | int, version: int) -> int:
    """The simulator's rank of a record: compares as (lifecycle, version) does."""
    return int(lifecycle) << _SHIFT | version


def lifecycle_of(rank: int) -> int:
    """The lifecycle of a rank."""
    return rank >> _SHIFT


def version_of(rank: int) -> int:
    """The version of a rank."""
    return rank & ((1 << _SHIFT) - 1)


def is_live(rank: int) -> bool:
    """Whether a rank is JOIN or SERVING: a live session, one SWIM watches."""
    return rank >= 0 and rank >> _SHIFT <= 1


def _mix(session: int, rank: int) -> int:
    """A 64-bit fingerprint of one (session, rank) entry (splitmix64 finalizer)."""
    if rank < 0:
        return 0
    z = (session * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class ReplicaStore:
    """The replicas of all nodes: `rank(node, session)`, `apply`, equality of digests, and the diff of two."""

    def __init__(self, base: list[int]) -> None:
        self.base = base
        self._base_hash = sum(_mix(s, r) for s, r in enumerate(base)) & _MASK
        self._base_known = sum(1 for r in base if r >= 0)
        self.based: list[bool] = []
        self.over: list[dict[int, int]] = []
        self.hash: list[int] = []
        self.known: list[int] = []
        """Sessions each replica holds (the length of its digest)."""
        self.listeners: list[ApplyListener] = []
        self.applies = 0

    def __repr__(self) -> str:
        return f"<ReplicaStore base={len(self.base)} replicas={len(self.over)}>"

    def add_replica(self, *, based: bool) -> int:
        """A new replica: a copy of the base (a warm-start node) or empty (a joiner); returns its index."""
        self.based.append(based)
        self.over.append({})
        self.hash.append(self._base_hash if based else 0)
        self.known.append(self._base_known if based else 0)
        return len(self.over) - 1

    def _base_rank(self, node: int, session: int) -> int:
        if self.based[node] and session < len(self.base):
            return self.base[session]
        return UNKNOWN

    def rank(self, node: int, session: int) -> int:
        """The rank `node` holds for `session` (UNKNOWN when none)."""
        got = self.over[node].get(session)
        return got if got is not None else self._base_rank(node, session)

    def apply(self, node: int, session: int, rank: int) -> bool:
        """Merge one record into `node`'s replica: the greater rank wins; True when it changed."""
        over = self.over[node]
        old = over.get(session)
        if old is None:
            old = self._base_rank(node, session)
        if rank <= old:
            return False
        over[session] = rank
        self.hash[node] = (self.hash[node] + _mix(session, rank) - _mix(session, old)) & _MASK
        if old < 0:
            self.known[node] += 1
        self.applies += 1
        for listener in self.listeners:
            listener(node, session, old, rank)
        return True

    def same(self, a: int, b: int) -> bool:
        """Whether the two replicas' digests are equal (what the 16-byte digest hash tells)."""
        return self.hash[a] == self.hash[b]

    def entries(self, node: int) -> dict[int, int]:
        """Every (session, rank) `node` holds; O(sessions), for joins and checks."""
        out = {s: r for s, r in enumerate(self.base) if r >= 0} if self.based[node] else {}
        out.update(self.over[node])
        return out

    def diff(self, a: int, b: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(what `a` holds newer than `b`, what `b` holds newer than `a`), as (session, rank) lists.

        `GMap.newer_than` and `GMap.wanted_from` of one exchange. Two warm-start replicas compare only their
        differences from the base; a joiner's replica is compared entry by entry.
        """
        if self.based[a] and self.based[b]:
            keys = self.over[a].keys() | self.over[b].keys()
        else:
            keys = self.entries(a).keys() | self.entries(b).keys()
        a_newer, b_newer = [], []
        for s in keys:
            ra, rb = self.rank(a, s), self.rank(b, s)
            if ra > rb:
                a_newer.append((s, ra))
            elif rb > ra:
                b_newer.append((s, rb))
        return a_newer, b_newer
