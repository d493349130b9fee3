"""LLaMA blocks cut for tensor parallelism: attention by KV head, the FFN by fixed shards, sums in a fixed order.

A tensor-parallel rank holds some *units* of every block: KV heads (with their query heads' slices of Q and O)
and FFN shards (equal cuts of the intermediate dimension: slices of gate and up, rows of down). Each unit turns a
block's normalized input into a partial output ``[T, hidden]``; the block's output is the residual plus the sum of
its units' partials. The cut is canonical: a unit computes the same bits on whichever rank holds it, and
`reduce_partials` adds the partials in unit order, so one process holding every unit (`TensorParallelReference`)
and any number of ranks holding them between them produce identical hidden states. That is what lets a replica
move units between ranks after a failure and continue its requests with exactly the tokens it would have produced.

The fused `BlockStack` of the pipeline is the faster layout for one process (one matmul per projection); this one
pays a matmul per unit (measured in docs/benchmarks/raidserve_engine.md) for the freedom to place units anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opentela.model.backend import Backend, get_backend
from opentela.model.blocks import rope_tables
from opentela.model.config import ModelConfig
from opentela.model.head import ClientHead
from opentela.model.kv_cache import CacheLayout, SessionCache
from opentela.model.local import check_generation, generate_tokens
from opentela.model.sampling import GREEDY, SamplingParams
from opentela.model.threads import DEFAULT_THREADS, set_blas_threads
from opentela.model.weights import GGUFWeights, TensorIndex

DEFAULT_FFN_SHARDS = 6
"""FFN cuts of SmolLM2's 1,536-wide intermediate dimension: even over 1, 2, 3 and 6 ranks, 256 wide (eight
32-value quantization blocks), so a rank dequantizes only its own shards."""


@dataclass(frozen=True)
class HeadWeights:
    """One KV head's slice of a block: Q (its query heads), K and V side by side, and its rows of O."""

    qkv: Any  # [hidden, (group + 2) * head_dim]
    out: Any  # [group * head_dim, hidden]


@dataclass(frozen=True)
class ShardWeights:
    """One FFN shard of a block: its gate and up columns side by side, and its rows of down."""

    gate_up: Any  # [hidden, 2 * width]
    down: Any  # [width, hidden]


def head_cache_layout(config: ModelConfig) -> CacheLayout:
    """The cache shape of one KV head: the unit a rank stores, backs up and restores."""
    return CacheLayout(1, config.head_dim)


def reduce_partials(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of a block's unit partials, added in the order given (unit order): the same bits on any layout."""
    if not parts:
        raise ValueError("no partial outputs to add")
    total = np.array(parts[0], dtype=np.float32, copy=True)
    for part in parts[1:]:
        total += part
    return total


class ShardedBlocks:
    """The units of every block that one rank holds, loaded and dropped one by one.

    Norm weights (a few KB per block) are held by every rank; each rank normalizes the block input itself.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        n_ffn_shards: int = DEFAULT_FFN_SHARDS,
        backend: str | Backend = "numpy",
        *,
        config: ModelConfig | None = None,
        index: TensorIndex | None = None,
    ) -> None:
        """`config` and `index` (`GGUFWeights.tensor_index`), when another process has read them from the file
        already, spare this one parsing its metadata."""
        self.path = str(path)
        self.config = cfg = config or ModelConfig.from_gguf(path)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"{cfg.n_heads} query heads do not group evenly over {cfg.n_kv_heads} KV heads")
        if n_ffn_shards < 1 or cfg.intermediate_size % n_ffn_shards:
            raise ValueError(
                f"the FFN's {cfg.intermediate_size} columns do not cut into {n_ffn_shards} equal shards"
            )
        self.n_ffn_shards = n_ffn_shards
        self.shard_width = cfg.intermediate_size // n_ffn_shards
        self.group = cfg.n_heads // cfg.n_kv_heads
        self.backend = get_backend(backend)
        self._weights = GGUFWeights(path, index)
        be = self.backend
        self._attn_norm = [be.asarray(self._weights.tensor(f"blk.{i}.attn_norm.weight")) for i in self.layers]
        self._ffn_norm = [be.asarray(self._weights.tensor(f"blk.{i}.ffn_norm.weight")) for i in self.layers]
        cos, sin = rope_tables(cfg, cfg.context_length)
        self._cos, self._sin = be.asarray(cos), be.asarray(sin)
        self.heads: dict[int, list[HeadWeights]] = {}
        """KV head -> its weights in every block."""
        self.shards: dict[int, list[ShardWeights]] = {}
        """FFN shard -> its weights in every block."""

    def __repr__(self) -> str:
        return f"<ShardedBlocks {self.config.name} heads={sorted(self.heads)} shards={sorted(self.shards)}>"

    @property
    def layers(self) -> range:
        """Block indices."""
        return range(self.config.n_blocks)

    # --- weights -----------------------------------------------------------------------------------------------
    def load(self, heads: Iterable[int] = (), shards: Iterable[int] = ()) -> int:
        """Load the units not held yet; returns the bytes loaded (0: all were held)."""
        loaded = 0
        for h in sorted(set(heads) - set(self.heads)):
            if not 0 <= h < self.config.n_kv_heads:
                raise ValueError(f"KV head {h} is outside the model's {self.config.n_kv_heads}")
            self.heads[h] = [self._load_head(i, h) for i in self.layers]
            loaded += sum(w.qkv.nbytes + w.out.nbytes for w in self.heads[h])
        for s in sorted(set(shards) - set(self.shards)):
            if not 0 <= s < self.n_ffn_shards:
                raise ValueError(f"FFN shard {s} is outside the {self.n_ffn_shards} shards")
            self.shards[s] = [self._load_shard(i, s) for i in self.layers]
            loaded += sum(w.gate_up.nbytes + w.down.nbytes for w in self.shards[s])
        return loaded

    def drop(self, heads: Iterable[int] = (), shards: Iterable[int] = ()) -> None:
        """Forget units this rank no longer computes."""
        for h in heads:
            self.heads.pop(h, None)
        for s in shards:
            self.shards.pop(s, None)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the units held."""
        heads = sum(w.qkv.nbytes + w.out.nbytes for ws in self.heads.values() for w in ws)
        return heads + sum(w.gate_up.nbytes + w.down.nbytes for ws in self.shards.values() for w in ws)

    def _load_head(self, layer: int, head: int) -> HeadWeights:
        w, d, g, name = self._weights, self.config.head_dim, self.group, f"blk.{layer}."
        q_rows, kv_rows = (head * g * d, (head + 1) * g * d), (head * d, (head + 1) * d)
        qkv = np.concatenate(
            [
                w.linear_part(name + "attn_q.weight", rows=q_rows),
                w.linear_part(name + "attn_k.weight", rows=kv_rows),
                w.linear_part(name + "attn_v.weight", rows=kv_rows),
            ],
            axis=1,
        )
        out = w.linear_part(name + "attn_output.weight", cols=q_rows)
        be = self.backend
        return HeadWeights(be.asarray(np.ascontiguousarray(qkv)), be.asarray(out))

    def _load_shard(self, layer: int, shard: int) -> ShardWeights:
        w, name = self._weights, f"blk.{layer}."
        cut = (shard * self.shard_width, (shard + 1) * self.shard_width)
        gate_up = np.concatenate(
            [
                w.linear_part(name + "ffn_gate.weight", rows=cut),
                w.linear_part(name + "ffn_up.weight", rows=cut),
            ],
            axis=1,
        )
        down = w.linear_part(name + "ffn_down.weight", cols=cut)
        be = self.backend
        return ShardWeights(be.asarray(np.ascontiguousarray(gate_up)), be.asarray(down))

    # --- math --------------------------------------------------------------------------------------------------
    def new_head_cache(self, max_length: int) -> SessionCache:
        """One KV head's cache over every block, for one request."""
        return SessionCache(self.config.n_blocks, head_cache_layout(self.config), max_length)

    def attention_input(self, layer: int, x: np.ndarray) -> Any:
        """Block `layer`'s normalized input for attention."""
        be = self.backend
        return be.rms_norm(be.asarray(x), self._attn_norm[layer], self.config.rms_norm_eps)

    def ffn_input(self, layer: int, x: np.ndarray) -> Any:
        """Block `layer`'s normalized input for the FFN."""
        be = self.backend
        return be.rms_norm(be.asarray(x), self._ffn_norm[layer], self.config.rms_norm_eps)

    def head_partial(
        self, layer: int, normed: Any, head: int, cache: SessionCache
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """KV head `head`'s partial output of block `layer`, and the new tokens' K and V ``[T, head_dim]``.

        The new K and V are written into `cache` (block `layer`) after its `length`; attention is causal over the
        cache plus the new tokens. The caller advances the cache once every block has run.
        """
        be, d, g = self.backend, self.config.head_dim, self.group
        weights = self.heads[head][layer]
        qkv = be.matmul(normed, weights.qkv)
        t, pos = qkv.shape[0], cache.length
        q = qkv[:, : g * d].reshape(t, g, d)
        k = qkv[:, g * d : (g + 1) * d].reshape(t, 1, d)
        v = qkv[:, (g + 1) * d :].reshape(t, 1, d)
        cos, sin = self._cos[pos : pos + t], self._sin[pos : pos + t]
        q, k = be.rope(q, cos, sin), be.rope(k, cos, sin)
        k_new, v_new = be.to_numpy(k).reshape(t, d), be.to_numpy(v).reshape(t, d)
        keys, values = cache.extend(layer, k_new[None], v_new[None])
        mixed = be.attention(q, be.asarray(keys), be.asarray(values), pos)
        return be.to_numpy(be.matmul(mixed, weights.out)), k_new, v_new

    def shard_partial(self, layer: int, normed: Any, shard: int) -> np.ndarray:
        """FFN shard `shard`'s partial output of block `layer`."""
        be, width = self.backend, self.shard_width
        weights = self.shards[shard][layer]
        gate_up = be.matmul(normed, weights.gate_up)
        return be.to_numpy(be.matmul(be.silu_mul(gate_up[:, :width], gate_up[:, width:]), weights.down))


class TensorParallelReference:
    """Every unit in one process: the tokens a tensor-parallel replica must reproduce at any degree.

    It keeps the replica's step pattern (the prompt as one chunk, then one token per step, logits of the last row)
    and its BLAS thread count (model/threads.py).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        n_ffn_shards: int = DEFAULT_FFN_SHARDS,
        threads: int | None = DEFAULT_THREADS,
    ) -> None:
        set_blas_threads(threads)
        self.blocks = ShardedBlocks(path, n_ffn_shards)
        self.config = self.blocks.config
        self.blocks.load(range(self.config.n_kv_heads), range(n_ffn_shards))
        self.head = ClientHead(path)

    def step(self, hidden: np.ndarray, caches: Sequence[SessionCache]) -> np.ndarray:
        """Run every block on new tokens' hidden states with one cache per KV head; advances the caches."""
        blocks = self.blocks
        x = hidden
        for layer in blocks.layers:
            normed = blocks.attention_input(layer, x)
            heads = [blocks.head_partial(layer, normed, h, caches[h])[0] for h in range(len(caches))]
            x = x + reduce_partials(heads)
            normed = blocks.ffn_input(layer, x)
            x = x + reduce_partials(
                [blocks.shard_partial(layer, normed, s) for s in range(blocks.n_ffn_shards)]
            )
        for cache in caches:
            cache.advance(hidden.shape[0])
        return x

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        stop_ids: Iterable[int] = (),
    ) -> list[int]:
        """New token ids after `prompt_ids` (at most `max_new_tokens`; a token in `stop_ids` ends the list)."""
        max_length = check_generation(prompt_ids, max_new_tokens, self.config.context_length)
        caches = [self.blocks.new_head_cache(max_length) for _ in range(self.config.n_kv_heads)]
        return generate_tokens(
            self.head,
            lambda hidden: self.step(hidden, caches),
            prompt_ids,
            max_new_tokens,
            sampling,
            stop_ids,
        )
