"""What a replica must move when it loses a device, and how long that takes (RaidServe section 3.2, Table 3).

The plan goes from the layout before the failure to the one on the survivors:

- **FFN shards**: on demand, every survivor keeps the shards it holds and the lost device's shards are dealt out
  cyclically over the survivors (Fig. 4: TP4 -> 3 reloads one shard per survivor). A naive re-shard instead cuts
  the intermediate dimension anew into contiguous ranges and loads every shard a survivor does not already hold.
- **Attention weights**: a survivor needs the weights of the heads it now runs (its tensor-parallel heads and
  every replicated head). What no survivor holds comes from host memory once, each survivor loading a disjoint
  share, and the other survivors get it over NVLink.
- **KV cache**: the backup in host memory holds everything; what the lost device held is read back over PCIe by
  the survivor that holds it in the new layout, and cache that survives but now belongs elsewhere moves over
  NVLink. Recompute instead re-prefills every in-flight token on the survivors.

PCIe and NVLink transfers of different survivors run in parallel; each survivor's time is the larger of its PCIe
and its NVLink bytes over their bandwidths (the two overlap, as the paper does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentela.engines.tp.placement import contiguous_groups, survivor_heads, survivor_shards
from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device
from opentela.scheduler.raidserve.layout import Layout, plan_layout
from opentela.scheduler.roofline import Precision, step_time

PCIE_GBS = 50.0
"""Host-to-device bytes per second per GPU on PCIe 5.0 x16 in practice (the paper's figure)."""


@dataclass(frozen=True)
class Transfer:
    """Bytes one survivor receives during recovery."""

    ffn_pcie: float = 0.0
    attention_pcie: float = 0.0
    attention_nvlink: float = 0.0
    kv_pcie: float = 0.0
    kv_nvlink: float = 0.0

    @property
    def pcie(self) -> float:
        """All bytes over PCIe."""
        return self.ffn_pcie + self.attention_pcie + self.kv_pcie

    @property
    def nvlink(self) -> float:
        """All bytes over NVLink."""
        return self.attention_nvlink + self.kv_nvlink


@dataclass(frozen=True)
class RecoveryPlan:
    """The layout after losing `lost`, and what each survivor receives by each way of recovering."""

    before: Layout
    after: Layout
    lost: int
    ffn_kept: tuple[tuple[int, ...], ...]
    """Per survivor: FFN shards it keeps."""
    ffn_loaded: tuple[tuple[int, ...], ...]
    """Per survivor: FFN shards it loads from host memory (on demand)."""
    on_demand: tuple[Transfer, ...]
    """Per survivor: RaidServe's recovery (KV from the backup, weights on demand)."""
    naive_weights: tuple[float, ...]
    """Per survivor: PCIe bytes of a naive re-shard of every weight."""
    times: dict[str, float] = field(default_factory=dict)
    """Seconds: ``full`` (on-demand weights and KV backup), ``host`` (KV backup, weights re-sharded),
    ``recompute`` (weights re-sharded and the lost cache re-prefilled), ``prefill`` (that re-prefill alone) and
    ``kv_only`` (the backup's KV alone)."""


def _survivor_layout(
    before: Layout, lost: int
) -> tuple[Layout, tuple[tuple[int, ...], ...], list[list[int]]]:
    """RaidServe's layout on the survivors, built to keep what they hold; with the kept and loaded FFN shards."""
    survivors = tuple(d for d in before.devices if d != lost)
    old_rank = {d: r for r, d in enumerate(before.devices)}
    kept = tuple(before.ffn[old_rank[d]] for d in survivors)
    ffn, loaded = survivor_shards(before.ffn, old_rank[lost])
    groups, replicated = survivor_heads(
        before.tp_heads, before.replicated, before.model.num_kv_heads, tuple(old_rank[d] for d in survivors)
    )
    fresh = plan_layout(before.model, survivors, "raidserve", n_shards=before.n_shards)
    after = Layout(
        model=before.model,
        mode="raidserve",
        devices=survivors,
        tp_heads=groups,
        replicated=replicated,
        rotate=fresh.rotate,
        ffn=ffn,
        n_shards=before.n_shards,
        dtype=before.dtype,
        kv_dtype=before.kv_dtype,
    )
    return after, kept, loaded


def _head_holders(layout: Layout, layer: int, head: int, base: int) -> tuple[int, ...]:
    """Device ids holding `head`'s KV cache of `layer` for requests of base rank `base` (rank index)."""
    if head in layout.replicated:
        return (layout.devices[layout.dp_rank(base, layer)],)
    return tuple(layout.devices[r] for r in range(layout.ranks) if head in layout.heads_at(r, layer))


def _weights_held(layout: Layout, rank: int) -> set[tuple[int, int]]:
    """(layer, head) attention weights `rank` holds."""
    m = layout.model
    return {(i, h) for i in range(m.num_layers) for h in (*layout.heads_at(rank, i), *layout.replicated)}


def plan_recovery(
    before: Layout,
    lost: int,
    device: Device,
    inflight_tokens: Sequence[int],
    *,
    pcie_gbs: float = PCIE_GBS,
    nvlink_gbs: float | None = None,
) -> RecoveryPlan:
    """The recovery of `before` after device `lost` fails, with requests of `inflight_tokens` tokens each in flight
    (their base ranks dealt round-robin, as a balanced router leaves them)."""
    if lost not in before.devices:
        raise ConfigError(f"device {lost} is not one of the replica's {before.devices}")
    if before.ranks < 2:
        raise ConfigError("a replica on one device has no survivors to recover on")
    m = before.model
    after, kept, loaded = _survivor_layout(before, lost)
    index = {d: r for r, d in enumerate(after.devices)}
    per_token_head = before.kv_head_token_bytes

    # KV cache: each request's (layer, head) cache moves from its old holder to its new one.
    kv_pcie: dict[int, float] = defaultdict(float)
    kv_nvlink: dict[int, float] = defaultdict(float)
    for k, tokens in enumerate(inflight_tokens):
        old_base = k % before.ranks
        new_base = k % after.ranks
        for i in range(m.num_layers):
            for h in range(m.num_kv_heads):
                had = _head_holders(before, i, h, old_base)
                for holder in _head_holders(after, i, h, new_base):
                    if holder in had:
                        continue
                    if all(d == lost for d in had):
                        kv_pcie[holder] += tokens * per_token_head
                    else:
                        kv_nvlink[holder] += tokens * per_token_head

    # Attention weights: what no survivor holds comes from host once, shared out; the rest over NVLink.
    held = {d: _weights_held(before, r) for r, d in enumerate(before.devices) if d != lost}
    anywhere = set().union(*held.values())
    needs = {d: _weights_held(after, index[d]) for d in after.devices}
    fresh: dict[tuple[int, int], list[int]] = defaultdict(list)
    for d in after.devices:
        for item in needs[d] - held[d]:
            fresh[item].append(d)
    att_pcie: dict[int, float] = defaultdict(float)
    att_nvlink: dict[int, float] = defaultdict(float)
    turn = 0
    for item, wanting in sorted(fresh.items()):
        if item in anywhere:
            for d in wanting:
                att_nvlink[d] += before.head_weight_bytes
            continue
        loader = wanting[turn % len(wanting)]  # each survivor loads a disjoint share from host memory
        turn += 1
        att_pcie[loader] += before.head_weight_bytes
        for d in wanting:
            if d != loader:
                att_nvlink[d] += before.head_weight_bytes

    shard_layers = before.shard_bytes * m.num_layers
    on_demand = tuple(
        Transfer(
            ffn_pcie=len(loaded[r]) * shard_layers,
            attention_pcie=att_pcie[d],
            attention_nvlink=att_nvlink[d],
            kv_pcie=kv_pcie[d],
            kv_nvlink=kv_nvlink[d],
        )
        for r, d in enumerate(after.devices)
    )
    # A naive re-shard: contiguous FFN ranges and head groups for the new degree, loaded where not resident.
    naive_ffn = contiguous_groups(before.n_shards, after.ranks)
    naive = tuple(
        len(set(naive_ffn[r]) - set(kept[r])) * shard_layers
        + len(needs[d] - held[d]) * before.head_weight_bytes
        for r, d in enumerate(after.devices)
    )
    pcie, nvlink = pcie_gbs * 1e9, (nvlink_gbs or device.interconnect_gbs or pcie_gbs) * 1e9

    def slowest(per_device: Sequence[tuple[float, float]]) -> float:
        return max(max(p / pcie, n / nvlink) for p, n in per_device)

    kv_only = slowest([(t.kv_pcie, t.kv_nvlink) for t in on_demand])
    full = slowest([(t.pcie, t.nvlink) for t in on_demand])
    host = slowest([(w + t.kv_pcie, t.kv_nvlink) for w, t in zip(naive, on_demand, strict=True)])
    lost_tokens = [t for t in inflight_tokens if t > 0]
    prefill = (
        step_time(
            m, device, prefill=lost_tokens, tp=after.ranks, precision=Precision(before.dtype, before.kv_dtype)
        )
        if lost_tokens
        else 0.0
    )
    recompute = slowest([(w, 0.0) for w in naive]) + prefill
    return RecoveryPlan(
        before=before,
        after=after,
        lost=lost,
        ffn_kept=kept,
        ffn_loaded=tuple(tuple(x) for x in loaded),
        on_demand=on_demand,
        naive_weights=naive,
        times={"recompute": recompute, "host": host, "full": full, "kv_only": kv_only, "prefill": prefill},
    )
