"""Step times of a tensor-parallel replica under any `Layout`: the slowest rank of every layer sets the pace.

Tensor parallelism synchronises twice per layer (an all-reduce after attention, one after the FFN), so a layer
takes the longest of its ranks' attention times plus the longest of their FFN times, plus the two all-reduces.
A rank's attention covers its tensor-parallel heads for every request of the batch and, under hybrid attention,
the replicated heads of the requests whose layer it holds (base rank r keeps layer i on rank (r + i) mod n).
Per-rank work is the roofline of `opentela.scheduler.roofline` on that rank's share; embeddings and the LM head
are split by vocabulary, as in `StepCost`.

The batch is described per base rank (contexts of decoding sequences, prompt tokens and their squares), so the
same model times a balanced router, a skewed one and Alg. 1's chunked prefill alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opentela.scheduler.hardware import Device
from opentela.scheduler.models import BYTES_PER_ELEMENT
from opentela.scheduler.raidserve.layout import Layout
from opentela.scheduler.roofline import Precision, StepCost, allreduce_time, mlp_operators


@dataclass(frozen=True)
class RankBatch:
    """One step's work from the requests of each base rank (arrays of length `ranks`)."""

    decodes: np.ndarray
    """Sequences decoding one token."""
    decode_ctx: np.ndarray
    """Their cached tokens, summed."""
    prefill: np.ndarray
    """New prompt tokens (chunks)."""
    prefill_n2: np.ndarray
    """Causal attention work of the chunks: n^2 for a whole prompt of n, c^2 + 2cl for a chunk of c after l
    (the paper's O(N^2 + NL)); the same measure as `StepCost`'s sum of squares."""

    @classmethod
    def empty(cls, ranks: int) -> RankBatch:
        """No work anywhere."""
        z = np.zeros(ranks)
        return cls(z, z.copy(), z.copy(), z.copy())

    @property
    def tokens(self) -> float:
        """New tokens of the whole step."""
        return float(self.decodes.sum() + self.prefill.sum())


class LayoutCost:
    """Step time of a replica laid out by `layout` on `device` (tabulated where it depends on token counts)."""

    def __init__(
        self, layout: Layout, device: Device, precision: Precision | None = None, max_tokens: int = 8192
    ) -> None:
        self.layout, self.device = layout, device
        self.precision = precision or Precision(layout.dtype, layout.kv_dtype, layout.dtype)
        m, n = layout.model, layout.ranks
        self._whole = StepCost(m, device, n, self.precision, max_tokens=max_tokens, max_seqs=max_tokens)
        # heads[i, r]: tensor-parallel KV heads of rank r in layer i; base[i, r]: whose replicated heads it runs.
        layers = range(m.num_layers)
        self._heads: np.ndarray = np.array(
            [[len(layout.heads_at(r, i)) for r in range(n)] for i in layers], dtype=np.float64
        )
        if layout.mode == "standard" and n > m.num_kv_heads:
            self._heads[:] = m.num_kv_heads / n  # copies of a KV head split its query heads
        self._base: np.ndarray = np.array(
            [[_base_of(layout, r, i) for r in range(n)] for i in layers], dtype=np.int64
        )
        self._replicated = float(len(layout.replicated))
        self._ffn_share = np.array([layout.ffn_share(r) for r in range(n)])
        ab, kb, wb = (
            BYTES_PER_ELEMENT[x]
            for x in (self.precision.activations, self.precision.kv_cache, self.precision.weights)
        )
        hd, group, h = m.head_dim, layout.group, m.hidden_size
        self._peak, self._bw = device.peak(self.precision.activations), device.bandwidth
        self._mm_peak = device.peak(self.precision.compute)
        # Per KV head (and its query heads), per layer: projection weights, and per-token projection FLOPs.
        self._head_weights = h * hd * (2 * group + 2) * wb
        self._head_flops_tok = 2 * h * hd * (2 * group + 2)
        self._head_act_tok = (h + (2 * group + 2) * hd) * ab
        # Attention per KV head: decode reads K and V of the context; FLOPs for its query heads.
        self._dec_flops_ctx = 4 * group * hd
        self._dec_bytes_ctx = 2 * hd * kb
        self._pre_flops_n2 = 2 * group * hd
        self._pre_bytes_tok = (2 * group + 2) * hd * ab + 2 * hd * kb
        self._ab, self._h, self._wb = ab, h, wb
        self._ffn_memo: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"<LayoutCost {self.layout.mode} on {self.layout.ranks} x {self.device.name}>"

    def _ffn_time(self, tokens: int) -> float:
        """The slowest rank's FFN in one layer: its share of the whole FFN's roofline at even TP."""
        whole = self._ffn_memo.get(tokens)
        if whole is None:
            ops = mlp_operators(self.layout.model, tokens, self.layout.ranks, self.precision, self._wb)
            whole = self._ffn_memo[tokens] = sum(op.time(self.device, self.layout.ranks) for op in ops)
        return float(self._ffn_share.max() * self.layout.ranks * whole)

    def time(self, batch: RankBatch) -> float:
        """Seconds for one step of `batch`."""
        tokens = batch.tokens
        if tokens <= 0:
            return 0.0
        n, m = self.layout.ranks, self.layout.model
        all_tok = tokens
        all_ctx = float(batch.decode_ctx.sum())
        all_n2 = float(batch.prefill_n2.sum())
        all_pre = float(batch.prefill.sum())
        all_seq = float(batch.decodes.sum())
        # Per (layer, rank): tensor-parallel heads see everything; replicated heads see their base's requests.
        dp_tok = (batch.decodes + batch.prefill)[self._base]
        dp_ctx, dp_n2, dp_pre, dp_seq = (
            batch.decode_ctx[self._base],
            batch.prefill_n2[self._base],
            batch.prefill[self._base],
            batch.decodes[self._base],
        )
        heads, rep = self._heads, self._replicated
        tok_heads = heads * all_tok + rep * dp_tok
        weights = (heads + rep * (dp_tok > 0)) * self._head_weights
        proj = np.maximum(
            tok_heads * self._head_flops_tok / self._mm_peak,
            (weights + tok_heads * self._head_act_tok) / self._bw,
        )
        ctx = heads * all_ctx + rep * dp_ctx
        n2 = heads * all_n2 + rep * dp_n2
        pre = heads * all_pre + rep * dp_pre
        seq = heads * all_seq + rep * dp_seq
        attn = np.maximum(
            (ctx * self._dec_flops_ctx + n2 * self._pre_flops_n2) / self._peak,
            (ctx * self._dec_bytes_ctx + pre * self._pre_bytes_tok + seq * self._pre_bytes_tok) / self._bw,
        )
        attention = float((proj + attn).max(axis=1).sum())
        reduce = (
            2 * m.num_layers * allreduce_time(all_tok * self._h * self._ab, self.device, n) if n > 1 else 0.0
        )
        ffn = self._ffn_time(round(all_tok)) * m.num_layers
        sampled = round(all_seq) + int(np.count_nonzero(batch.prefill))
        return attention + ffn + reduce + self._whole.outside_layers(round(all_tok), sampled)


def _base_of(layout: Layout, rank: int, layer: int) -> int:
    """The base rank whose requests' replicated heads `rank` runs in `layer` (inverse of `Layout.dp_rank`)."""
    return (rank - layer) % layout.ranks if layout.rotate else rank


def balanced_batch(ranks: int, decodes: int, context: float, prefill: Sequence[int] = ()) -> RankBatch:
    """A batch spread evenly over base ranks: `decodes` sequences of `context` tokens and whole prompts."""
    share = np.full(ranks, decodes / ranks)
    pre = np.zeros(ranks)
    n2 = np.zeros(ranks)
    for k, length in enumerate(prefill):
        pre[k % ranks] += length
        n2[k % ranks] += length * length
    return RankBatch(share, share * context, pre, n2)
