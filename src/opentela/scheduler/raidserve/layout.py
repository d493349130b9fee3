"""Where one tensor-parallel replica puts its attention heads, KV cache and FFN shards over n devices.

Three ways to run a model on the devices a node has left (RaidServe, `papers/raidserve.txt`, sections 2.2 and 3.1):

- **standard**: TP degree 1, 2, 4 or 8 only, as vLLM and SGLang allow; with 7 devices left, 4 serve and 3 idle.
- **nonuniform**: every device serves; KV heads are split into contiguous groups, so with 8 heads on 7 devices one
  device holds two heads in every layer and sets the pace and the batch size (naive placement). With ``cyclic``,
  the groups rotate by one device per layer, which evens the KV cache over any n consecutive layers (Fig. 1).
- **raidserve**: every device gets ``n_kv // n`` heads tensor-parallel; the other ``n_kv % n`` heads are
  *replicated* and computed data-parallel (hybrid attention): a request with base rank r keeps their KV cache of
  layer i on device ``(r + i) mod n``, and that device computes them (cyclic placement, section 3.1).

FFN weights are cut along the intermediate dimension into a fixed number of shards, independent of n, so that a
layout after a failure can keep every shard a survivor holds (section 3.2). Query heads follow their KV head
(grouped-query attention); embeddings and the LM head are split by vocabulary, as tensor-parallel engines do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from opentela.engines.tp.placement import contiguous_groups, raidserve_heads
from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device
from opentela.scheduler.models import BYTES_PER_ELEMENT, ModelSpec
from opentela.scheduler.simulator import EngineLimits

Mode = Literal["standard", "nonuniform", "raidserve"]
MODES: tuple[Mode, ...] = ("standard", "nonuniform", "raidserve")
STANDARD_DEGREES = (8, 4, 2, 1)
DEFAULT_FFN_SHARDS = 840
"""lcm(1..8): the intermediate dimension splits evenly over any TP degree up to 8."""


def standard_degree(model: ModelSpec, devices: int) -> int | None:
    """The largest TP degree of 1/2/4/8 that `devices` allow and the model's heads divide; None: not even 1."""
    for tp in STANDARD_DEGREES:
        heads_ok = model.num_heads % tp == 0
        kv_ok = model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0
        if tp <= devices and heads_ok and kv_ok:
            return tp
    return None


@dataclass(frozen=True)
class Layout:
    """One replica's placement: per rank its tensor-parallel KV heads (in layer 0), the replicated heads, and
    its FFN shards. Ranks are positions 0..ranks-1; `devices` maps them to the node's device ids."""

    model: ModelSpec
    mode: Mode
    devices: tuple[int, ...]
    tp_heads: tuple[tuple[int, ...], ...]
    """KV heads each rank holds and computes for every request in layer 0 (shifted per layer when `rotate`)."""
    replicated: tuple[int, ...]
    """KV heads computed data-parallel (hybrid attention): their cache and work go to one rank per layer."""
    rotate: bool
    """Cyclic placement. Non-uniform TP: layer i's head group of rank r is layer 0's of rank r - i. RaidServe:
    the replicated heads of layer i go to rank (base + i) mod n rather than to the base rank in every layer (its
    tensor-parallel groups are all the same size and stay put, so a survivor keeps them after a failure)."""
    ffn: tuple[tuple[int, ...], ...]
    """FFN shards each rank holds (indices into `n_shards` equal cuts of the intermediate dimension)."""
    n_shards: int
    dtype: str = "bf16"
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n < 1 or len(self.tp_heads) != n or len(self.ffn) != n:
            raise ValueError("a layout needs one head group and one shard set per rank")

    # --- structure ---------------------------------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        """Devices the replica runs on."""
        return len(self.devices)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.model.num_heads // self.model.num_kv_heads

    @property
    def kv_copies(self) -> int:
        """How many ranks store each tensor-parallel KV head (standard TP past the KV head count copies them)."""
        return max(self.ranks // self.model.num_kv_heads, 1) if self.mode == "standard" else 1

    def heads_at(self, rank: int, layer: int) -> tuple[int, ...]:
        """Tensor-parallel KV heads `rank` holds in `layer`."""
        rotates = self.rotate and self.mode == "nonuniform"
        return self.tp_heads[(rank - layer) % self.ranks] if rotates else self.tp_heads[rank]

    def dp_rank(self, base: int, layer: int) -> int:
        """The rank that holds and computes the replicated heads of `layer` for a request with base rank `base`."""
        return (base + layer) % self.ranks if self.rotate else base % self.ranks

    # --- memory ------------------------------------------------------------------------------------------------
    @cached_property
    def kv_head_token_bytes(self) -> float:
        """K and V of one head, one layer, one token."""
        return 2 * self.model.head_dim * BYTES_PER_ELEMENT[self.kv_dtype]

    def kv_bytes_per_token(self, rank: int, base: int | None = None) -> float:
        """KV bytes one token of a request with base rank `base` puts on `rank`, over all layers; with no base,
        the mean over base ranks (what a balanced router gives)."""
        per_head, layers = self.kv_head_token_bytes, self.model.num_layers
        tp = sum(len(self.heads_at(rank, i)) for i in range(layers)) * per_head
        if not self.replicated:
            return tp
        if base is None:
            dp_layers = layers / self.ranks
        else:
            dp_layers = sum(1 for i in range(layers) if self.dp_rank(base, i) == rank)
        return tp + dp_layers * len(self.replicated) * per_head

    def worst_kv_bytes_per_token(self, rank: int) -> float:
        """The most KV bytes one token can put on `rank`, whatever its request's base rank."""
        if not self.replicated:
            return self.kv_bytes_per_token(rank)
        return max(self.kv_bytes_per_token(rank, b) for b in range(self.ranks))

    def kv_bytes_all_ranks(self) -> list[float]:
        """Mean KV bytes per token on each rank."""
        return [self.kv_bytes_per_token(r) for r in range(self.ranks)]

    @cached_property
    def head_weight_bytes(self) -> float:
        """Q, K, V and O weights of one KV head and its query heads in one layer."""
        m = self.model
        return m.hidden_size * m.head_dim * (2 * self.group + 2) * BYTES_PER_ELEMENT[self.dtype]

    @cached_property
    def shard_bytes(self) -> float:
        """One FFN shard of one layer (every expert's slice of it for a mixture of experts)."""
        m = self.model
        width = (m.moe_intermediate_size if m.is_moe else m.intermediate_size) / self.n_shards
        experts = max(m.num_experts, 1)
        return experts * 3 * m.hidden_size * width * BYTES_PER_ELEMENT[self.dtype]

    def attention_weight_bytes(self, rank: int) -> float:
        """Attention weights on `rank`: its tensor-parallel heads in every layer plus every replicated head."""
        m = self.model
        if self.mode == "standard" and self.ranks > m.num_kv_heads:
            # Copies of a KV head share its query heads: each rank holds K, V of one head and its share of Q, O.
            q_per_rank = m.num_heads // self.ranks
            per_layer = m.hidden_size * m.head_dim * (2 * q_per_rank + 2) * BYTES_PER_ELEMENT[self.dtype]
            return per_layer * m.num_layers
        heads = sum(len(self.heads_at(rank, i)) for i in range(m.num_layers))
        return (heads + len(self.replicated) * m.num_layers) * self.head_weight_bytes

    def weight_bytes(self, rank: int) -> float:
        """All weights on `rank`: attention, FFN shards, its vocabulary slice and the norms and router."""
        m, wb = self.model, BYTES_PER_ELEMENT[self.dtype]
        ffn = len(self.ffn[rank]) * self.shard_bytes * m.num_layers
        vocab = m.embedding_params / self.ranks * wb
        shared = ((2 * m.num_layers + 1) * m.hidden_size + m.num_layers * m.hidden_size * m.num_experts) * wb
        return self.attention_weight_bytes(rank) + ffn + vocab + shared

    def usable_bytes(self, device: Device, limits: EngineLimits) -> float:
        """What one device lends to weights and KV cache."""
        return device.memory_bytes * limits.memory_utilization - limits.activation_reserve_gib * 1024**3

    def max_batch_tokens(self, device: Device, limits: EngineLimits | None = None) -> int:
        """KV tokens the replica holds at once: every rank holds a share of each token, so the fullest rank
        decides (negative: the weights alone do not fit). Worst case over base ranks, so it always fits."""
        limits = limits or EngineLimits()
        usable = self.usable_bytes(device, limits)
        per_rank = []
        for r in range(self.ranks):
            free, per_token = usable - self.weight_bytes(r), self.worst_kv_bytes_per_token(r)
            if per_token > 0:
                per_rank.append(math.floor(free / per_token))
            elif free < 0:
                per_rank.append(-1)  # a rank that keeps no cache still has to hold its weights
        return min(per_rank)

    def fits(self, device: Device, context_tokens: int, limits: EngineLimits | None = None) -> bool:
        """Whether the weights fit and the cache holds one request of `context_tokens`."""
        return self.max_batch_tokens(device, limits) >= context_tokens

    # --- work --------------------------------------------------------------------------------------------------
    def attention_heads_per_token(self, rank: int) -> float:
        """Query heads `rank` computes per token on average (replicated heads shared out by a balanced router)."""
        m = self.model
        if self.mode == "standard" and self.ranks > m.num_kv_heads:
            return m.num_heads / self.ranks
        tp = sum(len(self.heads_at(rank, i)) for i in range(m.num_layers)) / m.num_layers
        return (tp + len(self.replicated) / self.ranks) * self.group

    def ffn_share(self, rank: int) -> float:
        """Fraction of the FFN work `rank` does."""
        return len(self.ffn[rank]) / self.n_shards

    def attention_step_heads(self) -> float:
        """Query heads per token of the slowest rank, summed over layers: tensor parallelism waits for the
        slowest rank at every layer, so a rank with an extra head in some layer slows that layer for all."""
        m = self.model
        if self.mode == "standard" and self.ranks > m.num_kv_heads:
            return m.num_heads / self.ranks * m.num_layers
        dp = len(self.replicated) / self.ranks  # a balanced router spreads the replicated heads' requests
        return sum(
            (max(len(self.heads_at(r, i)) for r in range(self.ranks)) + dp) * self.group
            for i in range(m.num_layers)
        )

    def imbalance(self) -> dict[str, float]:
        """Slowest over mean rank for attention work (per layer), FFN work and KV bytes (1.0: balanced)."""
        mean_attention = sum(self.attention_heads_per_token(r) for r in range(self.ranks)) / self.ranks
        out = {"attention": self.attention_step_heads() / (mean_attention * self.model.num_layers)}
        for key, values in (
            ("ffn", [self.ffn_share(r) for r in range(self.ranks)]),
            ("kv", [self.worst_kv_bytes_per_token(r) for r in range(self.ranks)]),
        ):
            mean = sum(values) / len(values)
            out[key] = max(values) / mean if mean else 1.0
        return out


def plan_layout(
    model: ModelSpec,
    devices: int | tuple[int, ...],
    mode: Mode,
    *,
    cyclic: bool | None = None,
    n_shards: int = DEFAULT_FFN_SHARDS,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> Layout:
    """The layout of `mode` on `devices` (a count or the surviving device ids). `cyclic` (see `Layout.rotate`)
    defaults to the mode's own choice: RaidServe yes, the others no. A ConfigError when the mode cannot use these
    devices."""
    ids = tuple(range(devices)) if isinstance(devices, int) else tuple(devices)
    if not ids:
        raise ConfigError("no devices to place the model on")
    if mode not in MODES:
        raise ConfigError(f"unknown TP mode {mode!r}; choose one of {', '.join(MODES)}")
    shards = min(n_shards, model.moe_intermediate_size if model.is_moe else model.intermediate_size)
    n_kv = model.num_kv_heads
    replicated: tuple[int, ...] = ()
    heads: tuple[tuple[int, ...], ...]
    if mode == "standard":
        tp = standard_degree(model, len(ids))
        if tp is None:
            raise ConfigError(f"{model.name}: no standard TP degree (1, 2, 4, 8) fits its heads")
        ids = ids[:tp]
        if tp > n_kv:
            heads = tuple((r * n_kv // tp,) for r in range(tp))
        else:
            heads = contiguous_groups(n_kv, tp)
    elif mode == "nonuniform":
        heads = contiguous_groups(n_kv, len(ids))
    else:
        heads, replicated = raidserve_heads(n_kv, len(ids))
    rotate = (mode == "raidserve") if cyclic is None else cyclic
    return Layout(
        model=model,
        mode=mode,
        devices=ids,
        tp_heads=heads,
        replicated=replicated,
        rotate=rotate and len(ids) > 1 and mode != "standard",
        ffn=contiguous_groups(shards, len(ids)),
        n_shards=shards,
        dtype=dtype,
        kv_dtype=kv_dtype,
    )


def minimum_devices(
    model: ModelSpec,
    device: Device,
    mode: Mode,
    context_tokens: int,
    limits: EngineLimits | None = None,
    max_devices: int | None = None,
) -> int | None:
    """The fewest devices on which `mode` holds the weights and one request of `context_tokens`; None: none do."""
    top = max_devices or max(device.devices_per_node, 1)
    for n in range(1, top + 1):
        try:
            layout = plan_layout(model, n, mode)
        except ConfigError:
            continue
        if layout.ranks == n and layout.fits(device, context_tokens, limits):
            return n
    return None
