"""Anti-entropy by shards: find which part of two digests differs before sending one.

When two replicas' digest hashes differ, the responder used to send its whole digest (about 37 bytes a key: 37 KB
at 1,000 nodes, 370 KB at 10,000), though under churn the difference is usually a record or two still on its way.
Instead it splits its keys into classes by the same stable hash as a joiner's first sync (`join_sync.shard_of`)
and sends a short hash of each class; the initiator answers with the classes whose hashes differ from its own,
and only those classes' digest follows. A round then costs about one class of the digest plus a few hundred
bytes of hashes, whatever the size of the registry. Pure functions; `gossip.py` and the simulator use them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import msgpack

from opentela.registry.join_sync import shard_of

SUMS_MIN_KEYS = 64
"""Below this many keys the whole digest is sent (it is no bigger than the class hashes would be)."""
KEYS_PER_SHARD = 16
"""About how many keys one class holds: the digest part sent for a class that differs."""
MAX_SHARDS = 256
"""At most this many classes (their hashes cost 10 bytes each)."""
HASH_BYTES = 8


def shard_count(keys: int) -> int:
    """How many classes a responder holding `keys` keys splits them into (0: send the whole digest)."""
    if keys < SUMS_MIN_KEYS:
        return 0
    return min(MAX_SHARDS, keys // KEYS_PER_SHARD)


def shard_hashes(digest: Mapping[str, tuple[int, int] | Sequence[int]], count: int) -> list[bytes]:
    """A short, order-independent hash of each class of the digest's keys."""
    groups: list[list[tuple[str, list[int]]]] = [[] for _ in range(count)]
    for key, rank in digest.items():
        groups[shard_of(key, count)].append((key, list(rank)))
    return [
        hashlib.blake2b(msgpack.packb(sorted(group), use_bin_type=True), digest_size=HASH_BYTES).digest()
        for group in groups
    ]


def differing(ours: Sequence[bytes], theirs: Sequence[bytes]) -> list[int]:
    """The classes whose hashes differ."""
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
