"""The prefix cache of a simulated replica: LRU over 16-token blocks named by chained prefix hashes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
"""Tokens per cached block; `TraceRecord.prefix_hashes` names the prompt's blocks of this size."""


class PrefixCache:
    """Which prompt blocks a replica still holds, evicting the least recently used beyond `capacity_blocks`.

    Hashes are chained (a block's hash covers every token before it), so a prompt hits on its longest run of
    leading blocks present in the cache.
    """

    __slots__ = ("_blocks", "capacity_blocks", "hits", "lookups")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(int(capacity_blocks), 0)
        self._blocks: OrderedDict[str, None] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __repr__(self) -> str:
        return (
            f"PrefixCache({len(self._blocks)}/{self.capacity_blocks} blocks, {self.hits}/{self.lookups} hit)"
        )

    def peek(self, hashes: Sequence[str]) -> int:
        """Leading blocks of `hashes` in the cache, without touching them."""
        count = 0
        for h in hashes:
            if h not in self._blocks:
                break
            count += 1
        return count

    def match(self, hashes: Sequence[str]) -> int:
        """Leading blocks of `hashes` in the cache (refreshing them as recently used)."""
        count = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            count += 1
        self.lookups += 1
        self.hits += count > 0
        return count

    def insert(self, hashes: Sequence[str]) -> None:
        """Remember a computed prompt's blocks, evicting the least recently used over capacity."""
        if not self.capacity_blocks:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
