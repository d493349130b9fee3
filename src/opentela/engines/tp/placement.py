"""Which rank of a tensor-parallel replica holds and computes which KV heads and FFN shards (RaidServe, section 3).

On n ranks every rank gets ``n_kv // n`` KV heads tensor-parallel; the other ``n_kv % n`` heads are *replicated*:
every rank holds their weights, and each request's cache and work for them in block i go to one rank,
``(base + i) mod n`` for a request with base rank `base` (hybrid attention with cyclic placement). FFN shards are a
fixed number of cuts dealt out contiguously. After a rank is lost, the survivors keep what they hold: each keeps
its tensor-parallel heads (up to the new per-rank count), heads left over become replicated, and the lost rank's
FFN shards are dealt round-robin to the survivors. The planner (scheduler/raidserve) and the engine use the same
rules, so the engine does what the planner predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def contiguous_groups(items: int, ranks: int) -> tuple[tuple[int, ...], ...]:
    """`items` indices cut into `ranks` contiguous groups, the first ``items % ranks`` one larger."""
    return tuple(tuple(int(i) for i in part) for part in np.array_split(np.arange(items), ranks))


def raidserve_heads(n_kv: int, ranks: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Fresh RaidServe head placement on `ranks` ranks: each rank's tensor-parallel heads, and the replicated ones."""
    if ranks < 1:
        raise ValueError("a replica needs at least one rank")
    per_rank = n_kv // ranks
    heads = tuple(tuple(range(r * per_rank, (r + 1) * per_rank)) for r in range(ranks))
    return heads, tuple(range(per_rank * ranks, n_kv))


def survivor_heads(
    tp_heads: tuple[tuple[int, ...], ...], replicated: tuple[int, ...], n_kv: int, survivors: tuple[int, ...]
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Head placement after a loss, keeping what survivors hold; `survivors` are old rank positions, in order.

    Each survivor keeps up to the new per-rank count of its tensor-parallel heads; survivors short of it take heads
    left over (ones they already hold replicated first); the rest are replicated.
    """
    if not survivors:
        raise ValueError("no survivors to place the heads on")
    per_rank = n_kv // len(survivors)
    taken: set[int] = set()
    groups: list[list[int]] = []
    for old in survivors:
        mine = [h for h in tp_heads[old] if h not in taken][:per_rank]
        taken.update(mine)
        groups.append(mine)
    pool = list(dict.fromkeys(h for h in (*replicated, *range(n_kv)) if h not in taken))
    for group in groups:
        while len(group) < per_rank:
            group.append(pool.pop(0))
    return tuple(tuple(g) for g in groups), tuple(sorted(pool))


def survivor_shards(
    ffn: tuple[tuple[int, ...], ...], lost: int
) -> tuple[tuple[tuple[int, ...], ...], list[list[int]]]:
    """FFN shards after rank position `lost` is gone: survivors keep theirs and take the lost ones round-robin.

    Returns each survivor's shards and, separately, the shards it must load.
    """
    kept = [ffn[r] for r in range(len(ffn)) if r != lost]
    if not kept:
        raise ValueError("no survivors to place the FFN shards on")
    loaded: list[list[int]] = [[] for _ in kept]
    for j, shard in enumerate(ffn[lost]):
        loaded[j % len(kept)].append(shard)
    return tuple(tuple(k) + tuple(add) for k, add in zip(kept, loaded, strict=True)), loaded


@dataclass(frozen=True)
class Placement:
    """One replica's units: per rank (a worker id, in rank order) its tensor-parallel heads and FFN shards, plus
    the replicated heads every rank holds and computes for the requests whose turn it is."""

    ranks: tuple[int, ...]
    tp_heads: tuple[tuple[int, ...], ...]
    replicated: tuple[int, ...]
    ffn: tuple[tuple[int, ...], ...]

    @classmethod
    def initial(cls, ranks: tuple[int, ...], n_kv: int, n_shards: int) -> Placement:
        """RaidServe's placement on fresh ranks."""
        heads, replicated = raidserve_heads(n_kv, len(ranks))
        return cls(tuple(ranks), heads, replicated, contiguous_groups(n_shards, len(ranks)))

    def __post_init__(self) -> None:
        if not self.ranks or len(self.tp_heads) != len(self.ranks) or len(self.ffn) != len(self.ranks):
            raise ValueError("a placement needs one head group and one shard set per rank")

    @property
    def degree(self) -> int:
        """Ranks serving."""
        return len(self.ranks)

    def position(self, worker: int) -> int:
        """`worker`'s rank position."""
        return self.ranks.index(worker)

    def dp_owner(self, base: int, layer: int) -> int:
        """The worker that holds and computes the replicated heads of `layer` for a request with base rank `base`."""
        return self.ranks[(base + layer) % self.degree]

    def computes(self, worker: int, layer: int, base: int) -> tuple[int, ...]:
        """The KV heads `worker` computes in `layer` for a request with base rank `base`, in head order."""
        mine = self.tp_heads[self.position(worker)]
        if self.replicated and self.dp_owner(base, layer) == worker:
            return tuple(sorted((*mine, *self.replicated)))
        return mine

    def owner(self, head: int, layer: int, base: int) -> int:
        """The worker holding `head`'s cache of `layer` for a request with base rank `base`."""
        if head in self.replicated:
            return self.dp_owner(base, layer)
        for worker, heads in zip(self.ranks, self.tp_heads, strict=True):
            if head in heads:
                return worker
        raise ValueError(f"KV head {head} is not placed")

    def weights_of(self, worker: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The KV heads and FFN shards whose weights `worker` holds."""
        pos = self.position(worker)
        return tuple(sorted((*self.tp_heads[pos], *self.replicated))), self.ffn[pos]

    def without(self, lost: int, n_kv: int) -> Placement:
        """The placement on the survivors of worker `lost`, keeping what each holds."""
        pos = self.position(lost)
        survivors = tuple(r for r in range(self.degree) if r != pos)
        heads, replicated = survivor_heads(self.tp_heads, self.replicated, n_kv, survivors)
        ffn, _ = survivor_shards(self.ffn, pos)
        return Placement(tuple(self.ranks[r] for r in survivors), heads, replicated, ffn)

    def describe(self) -> str:
        """One line for logs: each rank's heads and shards."""
        parts = [
            f"rank {w}: heads {list(h)} shards {list(s)}"
            for w, h, s in zip(self.ranks, self.tp_heads, self.ffn, strict=True)
        ]
        if self.replicated:
            parts.append(f"replicated heads {list(self.replicated)}")
        return "; ".join(parts)
