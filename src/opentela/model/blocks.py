"""A contiguous run of LLaMA decoder blocks [start, end), run on per-session caches."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opentela.model.backend import Backend, get_backend
from opentela.model.config import ModelConfig
from opentela.model.kv_cache import CacheLayout, SessionCache
from opentela.model.weights import GGUFWeights


@dataclass(frozen=True)
class _Block:
    """One block's weights, as the backend's arrays; matrices are ``[in, out]``."""

    attn_norm: Any
    qkv: Any  # Q, K and V projections side by side: one matmul per step instead of three
    out: Any
    ffn_norm: Any
    gate_up: Any  # gate and up projections side by side
    down: Any


def rope_tables(config: ModelConfig, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every position's rotary angles, ``[length, head_dim / 2]`` float32.

    Pair i of a head turns by ``position * rope_theta ** (-2i / head_dim)``; angles are computed in float64
    and rounded once, so a position's table row is the same whatever the table's length.
    """
    half = config.head_dim // 2
    inv_freq = config.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / config.head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class BlockStack:
    """Decoder blocks [start, end) of a GGUF model: weights in memory, math on a `Backend`.

    Each step takes the hidden states of T new tokens of one session, ``[T, hidden]`` float32, whose
    positions continue from the session cache's `length`; it appends their K and V to the cache and
    returns the hidden states after the last block. Attention is causal over cache plus new tokens, with
    grouped-query heads. Q and K are stored by llama.cpp's converter permuted for its "normal" RoPE, which
    rotates interleaved pairs ``(2i, 2i+1)``; the backend's `rope` does exactly that.

    Results are deterministic for a given sequence of step shapes: the same prompt chunk then single tokens
    reproduce the same bits anywhere with the same NumPy build and thread count.
    """

    def __init__(
        self, path: str | os.PathLike[str], start: int, end: int, backend: str | Backend = "numpy"
    ) -> None:
        self.path = str(path)
        self.config = config = ModelConfig.from_gguf(path)
        if not 0 <= start < end <= config.n_blocks:
            raise ValueError(f"blocks [{start}, {end}) are outside the model's {config.n_blocks} blocks")
        self.start, self.end = start, end
        self.backend = get_backend(backend)
        weights = GGUFWeights(path)
        self._blocks = [self._load_block(weights, i) for i in range(start, end)]
        cos, sin = rope_tables(config, config.context_length)
        self._cos, self._sin = self.backend.asarray(cos), self.backend.asarray(sin)
        self.weight_bytes = config.block_weight_bytes() * self.n_blocks
        self._q = config.n_heads * config.head_dim
        self._kv = config.n_kv_heads * config.head_dim

    def _load_block(self, weights: GGUFWeights, i: int) -> _Block:
        name = f"blk.{i}."
        fused = [
            np.concatenate([weights.linear(name + p + ".weight") for p in parts], axis=1)
            for parts in (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
        ]
        arrays = [
            weights.tensor(name + "attn_norm.weight"),
            fused[0],
            weights.linear(name + "attn_output.weight"),
            weights.tensor(name + "ffn_norm.weight"),
            fused[1],
            weights.linear(name + "ffn_down.weight"),
        ]
        return _Block(*(self.backend.asarray(np.ascontiguousarray(a)) for a in arrays))

    def __repr__(self) -> str:
        return f"<BlockStack {self.config.name} blocks [{self.start}, {self.end}) on {self.backend.name}>"

    @property
    def n_blocks(self) -> int:
        """How many blocks this stack runs."""
        return self.end - self.start

    @property
    def cache_layout(self) -> CacheLayout:
        """The per-block, per-token shape of this model's K and V."""
        return CacheLayout(self.config.n_kv_heads, self.config.head_dim)

    @property
    def cache_shape(self) -> tuple[int, int]:
        """One block's K (or V) per token: ``(n_kv_heads, head_dim)`` float32 values."""
        return (self.config.n_kv_heads, self.config.head_dim)

    @property
    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token takes across all of this stack's blocks."""
        return self.config.kv_bytes_per_token(self.n_blocks)

    def new_cache(self, max_length: int) -> SessionCache:
        """A fresh cache for one session over all of this stack's blocks."""
        return SessionCache.for_stack(self, max_length)

    def forward(
        self, hidden: np.ndarray, cache: SessionCache, first: int | None = None, end: int | None = None
    ) -> np.ndarray:
        """Run blocks [first, end) (default: all) on one session's new tokens ``[T, hidden]``."""
        return self.forward_many([(hidden, cache)], first, end)[0]

    def forward_many(
        self,
        steps: Sequence[tuple[np.ndarray, SessionCache]],
        first: int | None = None,
        end: int | None = None,
    ) -> list[np.ndarray]:
        """Run several sessions' steps together: dense matmuls over all their rows, attention per session.

        BLAS may split a matmul differently for a different number of rows, so a step's output batched with
        others can differ from the same step run alone in the last bits. A caller that needs exact replay
        (a session moved to another server) must run steps with the same batching both times.
        """
        first = self.start if first is None else first
        end = self.end if end is None else end
        if not self.start <= first < end <= self.end:
            raise ValueError(
                f"blocks [{first}, {end}) are not within this stack's [{self.start}, {self.end})"
            )
        if not steps:
            return []
        if len({id(cache) for _, cache in steps}) != len(steps):
            raise ValueError("each session may appear once in a batch")
        lengths = [self._check(hidden, cache, end - first) for hidden, cache in steps]
        be, cfg = self.backend, self.config
        x = be.asarray(np.concatenate([h for h, _ in steps]) if len(steps) > 1 else steps[0][0])
        bounds = np.cumsum([0, *lengths]).tolist()
        for index in range(first - self.start, end - self.start):
            block = self._blocks[index]
            qkv = be.matmul(be.rms_norm(x, block.attn_norm, cfg.rms_norm_eps), block.qkv)
            slot = index - (first - self.start)
            mixed = [
                self._attend(qkv[lo:hi], cache, slot)
                for (_, cache), lo, hi in zip(steps, bounds[:-1], bounds[1:], strict=True)
            ]
            x = x + be.matmul(mixed[0] if len(mixed) == 1 else be.concat(mixed), block.out)
            gate_up = be.matmul(be.rms_norm(x, block.ffn_norm, cfg.rms_norm_eps), block.gate_up)
            inter = cfg.intermediate_size
            x = x + be.matmul(be.silu_mul(gate_up[:, :inter], gate_up[:, inter:]), block.down)
        for (_, cache), t in zip(steps, lengths, strict=True):
            cache.advance(t)
        out = be.to_numpy(x)
        return [out[lo:hi] for lo, hi in itertools.pairwise(bounds)]

    def _check(self, hidden: np.ndarray, cache: SessionCache, n_blocks: int) -> int:
        size = self.config.hidden_size
        if hidden.ndim != 2 or hidden.shape[1] != size or hidden.shape[0] < 1 or hidden.dtype != np.float32:
            raise ValueError(
                f"hidden states must be float32 [tokens, {size}], not {hidden.dtype} {hidden.shape}"
            )
        if cache.n_blocks != n_blocks:
            raise ValueError(f"the cache holds {cache.n_blocks} blocks, the step runs {n_blocks}")
        if cache.layout != self.cache_layout:
            raise ValueError(f"the cache is shaped {cache.layout}, this model needs {self.cache_layout}")
        t = hidden.shape[0]
        if cache.length + t > min(cache.max_length, self.config.context_length):
            raise ValueError(
                f"{t} tokens after {cache.length} exceed the session's {cache.max_length} "
                f"(model context {self.config.context_length})"
            )
        return t

    def _attend(self, qkv: Any, cache: SessionCache, slot: int) -> Any:
        """One session's attention: RoPE at its positions, cache append, causal GQA over the whole cache."""
        be, cfg = self.backend, self.config
        t, pos = qkv.shape[0], cache.length
        q = qkv[:, : self._q].reshape(t, cfg.n_heads, cfg.head_dim)
        k = qkv[:, self._q : self._q + self._kv].reshape(t, cfg.n_kv_heads, cfg.head_dim)
        v = qkv[:, self._q + self._kv :].reshape(t, cfg.n_kv_heads, cfg.head_dim)
        cos, sin = self._cos[pos : pos + t], self._sin[pos : pos + t]
        q, k = be.rope(q, cos, sin), be.rope(k, cos, sin)
        keys, values = cache.extend(
            slot, be.to_numpy(k).transpose(1, 0, 2), be.to_numpy(v).transpose(1, 0, 2)
        )
        return be.attention(q, be.asarray(keys), be.asarray(values), pos)
