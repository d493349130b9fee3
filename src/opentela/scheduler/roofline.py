"""Stage 1 of the simulator: the operators of a decoder step and their roofline time on a device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device
from opentela.scheduler.models import BYTES_PER_ELEMENT, ModelSpec
from opentela.scheduler.step_model import StepModel

PLAIN_VIEW = StepModel()
"""No micro-batches, no KV padding: what attention runs over unless a step model says otherwise."""

ALLREDUCE_LATENCY_S = 5e-6
"""Fixed cost of one ring all-reduce hop (launch and synchronisation)."""


@dataclass(frozen=True)
class Precision:
    """Storage formats of weights, KV cache and activations."""

    weights: str = "fp16"
    kv_cache: str = "fp16"
    activations: str = "fp16"
    head: str = ""
    """Storage of the output projection (LM head) where it differs from `weights` (GGUF files often keep it
    in q8_0 next to 4-bit layers); empty: `weights`."""

    def __post_init__(self) -> None:
        for value in (self.weights, self.kv_cache, self.activations, self.head or self.weights):
            if value not in BYTES_PER_ELEMENT:
                raise ConfigError(f"unknown dtype {value!r}; known: {', '.join(BYTES_PER_ELEMENT)}")

    @property
    def compute(self) -> str:
        """The dtype the matrix units run linear layers in (W8A8 formats use their own rate)."""
        if self.weights in ("fp8", "int8"):
            return self.weights
        if self.weights in ("q4_1", "q8_0"):
            return "int8"  # llama.cpp quantises activations to 8 bits and runs integer dot products
        return self.activations if self.activations in ("fp16", "bf16", "fp32") else "fp16"


@dataclass(frozen=True)
class Operator:
    """One operator instance: operations and bytes moved on ONE device of the tensor-parallel group."""

    name: str
    flops: float
    bytes: float
    dtype: str = "fp16"
    comm_bytes: float = 0.0
    """Bytes each device sends over the interconnect (all-reduce), timed on the link, not on memory."""
    kind: str = "elementwise"
    """The operator class whose efficiency applies (`step_model.OPERATOR_CLASSES`)."""
    rows: float = 0.0
    """Rows of a matrix product (tokens in the step): its shape class."""

    def time(self, device: Device, tp: int = 1) -> float:
        """Roofline time under the device's step model: the slower of compute and memory traffic, or the
        interconnect transfer of an all-reduce."""
        if self.comm_bytes:
            return allreduce_time(self.comm_bytes, device, tp)
        return float(
            device.step.op_time(
                self.kind, self.flops, self.bytes, self.rows, device.peak(self.dtype), device.bandwidth
            )
        )


def allreduce_time(nbytes: float, device: Device, tp: int) -> float:
    """Ring all-reduce of `nbytes` per device across `tp` devices of a node."""
    if tp <= 1:
        return 0.0
    if device.link_bandwidth <= 0:
        raise ConfigError(f"{device.name} has no interconnect for tensor parallelism")
    return 2 * (tp - 1) / tp * nbytes / device.link_bandwidth + 2 * (tp - 1) * ALLREDUCE_LATENCY_S


def _split(heads: int, tp: int) -> float:
    # KV heads are replicated when there are fewer than tp of them.
    return max(heads / tp, 1.0)


def _linear(name: str, tokens: float, d_in: float, d_out: float, p: Precision, wb: float) -> Operator:
    ab = BYTES_PER_ELEMENT[p.activations]
    return Operator(
        name,
        2 * tokens * d_in * d_out,
        d_in * d_out * wb + tokens * (d_in + d_out) * ab,
        p.compute,
        kind="matmul",
        rows=tokens,
    )


def layer_operators(
    model: ModelSpec,
    prefill: Sequence[int] = (),
    decode: Sequence[int] = (),
    tp: int = 1,
    precision: Precision = Precision(),
    cached: Sequence[int] = (),
    view: StepModel = PLAIN_VIEW,
) -> list[Operator]:
    """The operators of ONE decoder layer for a batch: new prompts (or prompt chunks) of lengths `prefill`
    after `cached` tokens already in their KV caches (a prefix hit or earlier chunks; default none), and
    sequences decoding one token each whose KV caches hold `decode` tokens. `view` gives the engine's
    micro-batch, KV padding and KV traffic (what attention runs over and moves); its efficiencies play no
    part here."""
    p = precision
    ab, kb, wb = (BYTES_PER_ELEMENT[x] for x in (p.activations, p.kv_cache, p.weights))
    t = float(sum(prefill) + len(decode))
    h, hd = model.hidden_size, model.head_dim
    q_heads, kv_heads = model.num_heads / tp, _split(model.num_kv_heads, tp)
    ops = [Operator("input_norm", 4 * t * h, 2 * t * h * ab + h * ab, p.activations)]
    ops.append(_linear("q_proj", t, h, q_heads * hd, p, wb))
    ops.append(_linear("k_proj", t, h, kv_heads * hd, p, wb))
    ops.append(_linear("v_proj", t, h, kv_heads * hd, p, wb))
    if prefill:
        n = np.asarray(prefill, dtype=float)
        k = np.asarray(cached, dtype=float) if len(cached) else np.zeros_like(n)
        # Attention over (query, key) pairs: QK^T and PV each 2*hd per pair and head (causal: n*n/2 + n*k
        # pairs); flash attention reads q, k, v once and the cached KV, writes o and the new KV into the cache.
        pairs = sum(prompt_pairs(int(a), int(b), view) for a, b in zip(prefill, k, strict=True))
        flops = 4 * pairs * q_heads * hd
        moved = float(np.sum(n)) * ((2 * q_heads + 2 * kv_heads) * hd * ab + 2 * kv_heads * hd * kb)
        moved += float(np.sum(k)) * 2 * kv_heads * hd * kb
        ops.append(Operator("attention_prefill", flops, moved, p.activations, kind="attention_prefill"))
    if decode:
        # One query per sequence runs the vector kernel, which skips masked cells: the context itself counts.
        ctx = float(np.sum(np.asarray(decode, dtype=float)))
        # Each decoding sequence reads its whole KV cache, 2 (k, v) x ctx x kv_heads x hd, once or, where the
        # engine copies its cache every step, `view.kv_traffic` times over.
        flops = 4 * ctx * q_heads * hd
        moved = 2 * ctx * kv_heads * hd * kb * view.kv_traffic
        moved += len(decode) * (2 * q_heads + 2 * kv_heads) * hd * ab
        ops.append(Operator("attention_decode", flops, moved, p.activations, kind="attention_decode"))
    ops.append(_linear("o_proj", t, q_heads * hd, h, p, wb))
    if tp > 1:
        ops.append(Operator("allreduce_attn", 0.0, 0.0, comm_bytes=t * h * ab, kind="communication"))
    ops.append(Operator("post_attention_norm", 4 * t * h, 2 * t * h * ab + h * ab, p.activations))
    ops.extend(mlp_operators(model, t, tp, p, wb))
    if tp > 1:
        ops.append(Operator("allreduce_mlp", 0.0, 0.0, comm_bytes=t * h * ab, kind="communication"))
    return ops


def prompt_pairs(n: int, cached: int = 0, view: StepModel = PLAIN_VIEW) -> float:
    """(query, key) pairs prompt attention computes for a chunk of `n` tokens after `cached` ones.

    Causal, n*n/2 + n*cached, unless the engine pads its KV view (`view.kv_pad`): then each micro-batch's
    queries run over every cell of the padded view, masked cells included.
    """
    if not view.kv_pad:
        return n * n / 2 + n * cached
    total, done = 0.0, 0
    for rows in view.passes(n):
        done += rows
        total += rows * float(view.kv_cells(cached + done))
    return total


def mlp_operators(model: ModelSpec, t: float, tp: int, p: Precision, wb: float) -> list[Operator]:
    """The FFN (dense or mixture of experts) of one layer for `t` tokens on one of `tp` devices."""
    h = model.hidden_size
    if not model.is_moe:
        inter = model.intermediate_size / tp
        return [
            _linear("gate_proj", t, h, inter, p, wb),
            _linear("up_proj", t, h, inter, p, wb),
            _linear("down_proj", t, inter, h, p, wb),
        ]
    e, k, inter = model.num_experts, model.experts_per_token, model.moe_intermediate_size / tp
    # Expected number of distinct experts the batch's tokens route to: their weights are all read once.
    touched = e * (1 - (1 - k / e) ** t) if t else 0.0
    ab = BYTES_PER_ELEMENT[p.activations]
    return [
        _linear("router", t, h, e, p, BYTES_PER_ELEMENT[p.activations]),
        Operator(
            "experts",
            2 * t * k * 3 * h * inter,
            touched * 3 * h * inter * wb + t * k * (2 * h + 3 * inter) * ab,
            p.compute,
            kind="matmul",
            rows=t,
        ),
    ]


def model_operators(
    model: ModelSpec, tokens: int, sampled: int, tp: int = 1, precision: Precision = Precision()
) -> list[Operator]:
    """Operators outside the decoder layers: embedding lookup, final norm and lm_head for `sampled` rows."""
    p = precision
    ab, wb = BYTES_PER_ELEMENT[p.activations], BYTES_PER_ELEMENT[p.head or p.weights]
    h = model.hidden_size
    head = _linear("lm_head", sampled, h, model.vocab_size / tp, p, wb)
    return [
        Operator("embedding", 0.0, 2 * tokens * h * ab, p.activations),
        Operator("final_norm", 4 * sampled * h, 2 * sampled * h * ab + h * ab, p.activations),
        replace(head, kind="lm_head"),
    ]


def step_time(
    model: ModelSpec,
    device: Device,
    prefill: Sequence[int] = (),
    decode: Sequence[int] = (),
    tp: int = 1,
    precision: Precision = Precision(),
    cached: Sequence[int] = (),
) -> float:
    """Seconds for one forward step of a batch: every operator's roofline time under the device's step
    model, plus its per-step fixed cost. `cached` gives each prompt's tokens already in the KV cache."""
    step = device.step
    ops = layer_operators(model, prefill, decode, tp, precision, cached=cached, view=step)
    sampled = len(prefill) + len(decode)
    tokens = sum(prefill) + len(decode)
    passes = step.passes(tokens)
    if len(passes) == 1:
        layer = sum(op.time(device, tp) for op in ops)
    else:
        # Micro-batches: attention as one whole (its pairs do not depend on the split), the token-wise
        # operators pass by pass at that pass's rows.
        layer = sum(op.time(device, tp) for op in ops if op.name.startswith("attention"))
        for rows in passes:
            layer += sum(
                op.time(device, tp)
                for op in layer_operators(model, [rows], (), tp, precision)
                if not op.name.startswith("attention")
            )
    rest = sum(op.time(device, tp) for op in model_operators(model, tokens, sampled, tp, precision))
    overhead = device.step.step_overhead_s if sampled else 0.0
    return model.num_layers * layer + rest + overhead


class StepCost:
    """Step time as a function of a batch's aggregate shape, tabulated once so the simulator pays O(1) a step.

    Linear layers, norms and all-reduces depend only on the number of tokens in the step; lm_head on the number
    of sequences sampled; attention on the sum of decode contexts, on the sums of n and n^2 over prompt chunks
    (n^2 + 2nk for a chunk after k cached tokens) and on the cached tokens they read, because a batched
    attention kernel is one roofline operator over all sequences. The device's step model (efficiencies per
    operator class, per-step overhead) is folded in.
    """

    def __init__(
        self,
        model: ModelSpec,
        device: Device,
        tp: int = 1,
        precision: Precision = Precision(),
        max_tokens: int = 8192,
        max_seqs: int = 256,
    ) -> None:
        self.model, self.device, self.tp, self.precision = model, device, tp, precision
        step = device.step
        layers = model.num_layers
        tokens = np.arange(max(max_tokens, step.ubatch_tokens) + 1, dtype=float)
        self._pass = self._tabulate_linear(tokens) * layers
        linear = self._pass
        if step.ubatch_tokens:
            # Micro-batches: full passes of ubatch_tokens rows, then the rest.
            u = step.ubatch_tokens
            whole = np.arange(len(tokens))
            linear = (whole // u) * linear[u] + linear[whole % u]
        self._per_token = (linear + self._embedding(tokens))[: max_tokens + 1]
        seqs = np.arange(max_seqs + max_tokens + 1, dtype=float)
        self._lm_head = self._tabulate_lm_head(seqs)
        q_heads, kv_heads = model.num_heads / tp, _split(model.num_kv_heads, tp)
        hd = model.head_dim
        ab, kb = BYTES_PER_ELEMENT[precision.activations], BYTES_PER_ELEMENT[precision.kv_cache]
        peak, bw = device.peak(precision.activations), device.bandwidth * step.memory
        decode_peak = peak * step.efficiency("attention_decode")
        prefill_peak = peak * step.efficiency("attention_prefill")
        self._decode_flops_ctx = layers * 4 * q_heads * hd / decode_peak
        self._decode_bytes_ctx = layers * 2 * kv_heads * hd * kb * step.kv_traffic / bw
        self._prefill_flops_n2 = layers * 2 * q_heads * hd / prefill_peak
        self._prefill_bytes_n = (
            layers * ((2 * q_heads + 2 * kv_heads) * hd * ab + 2 * kv_heads * hd * kb) / bw
        )
        self._prefill_bytes_cached = layers * 2 * kv_heads * hd * kb / bw
        self._decode_bytes_seq = layers * (2 * q_heads + 2 * kv_heads) * hd * ab / bw
        self.overhead = step.step_overhead_s
        self.max_tokens = max_tokens

    def _tabulate_linear(self, tokens: np.ndarray) -> np.ndarray:
        # One layer's token-dependent operators, evaluated at every token count at once.
        m, p, tp, dev = self.model, self.precision, self.tp, self.device
        ref = [op for op in layer_operators(m, [1], (), tp, p) if not op.name.startswith("attention")]
        ref2 = [op for op in layer_operators(m, [2], (), tp, p) if not op.name.startswith("attention")]
        total = np.zeros_like(tokens)
        for a, b in zip(ref, ref2, strict=True):
            if a.comm_bytes:
                total += np.where(
                    tokens > 0, [allreduce_time(a.comm_bytes * t, dev, tp) for t in tokens], 0.0
                )
                continue
            if a.name == "experts":
                total += self._experts(tokens)
                continue
            # Every dense operator is affine in the token count: f(t) = f0 + t * df.
            df, db = b.flops - a.flops, b.bytes - a.bytes
            f0, b0 = a.flops - df, a.bytes - db
            flops, moved = f0 + tokens * df, b0 + tokens * db
            total += dev.step.op_time(a.kind, flops, moved, tokens, dev.peak(a.dtype), dev.bandwidth)
        total[0] = 0.0
        return total

    def _experts(self, tokens: np.ndarray) -> np.ndarray:
        return np.array(
            [
                0.0
                if t == 0
                else next(
                    op.time(self.device, self.tp)
                    for op in mlp_operators(
                        self.model, t, self.tp, self.precision, BYTES_PER_ELEMENT[self.precision.weights]
                    )
                    if op.name == "experts"
                )
                for t in tokens
            ]
        )

    def _embedding(self, tokens: np.ndarray) -> np.ndarray:
        ab = BYTES_PER_ELEMENT[self.precision.activations]
        dev = self.device
        moved = 2 * tokens * self.model.hidden_size * ab
        return np.asarray(
            dev.step.op_time(
                "elementwise", 0.0, moved, tokens, dev.peak(self.precision.activations), dev.bandwidth
            )
        )

    def _tabulate_lm_head(self, seqs: np.ndarray) -> np.ndarray:
        m, p, dev = self.model, self.precision, self.device
        one = [op for op in model_operators(m, 0, 1, self.tp, p) if op.name != "embedding"]
        two = [op for op in model_operators(m, 0, 2, self.tp, p) if op.name != "embedding"]
        total = np.zeros_like(seqs)
        for a, b in zip(one, two, strict=True):
            df, db = b.flops - a.flops, b.bytes - a.bytes
            flops, moved = a.flops - df + seqs * df, a.bytes - db + seqs * db
            total += dev.step.op_time(a.kind, flops, moved, seqs, dev.peak(a.dtype), dev.bandwidth)
        total[0] = 0.0
        return total

    def outside_layers(self, tokens: int, sampled: int) -> float:
        """Embedding lookup of `tokens` and final norm plus LM head for `sampled` rows (vocabulary split by TP)."""
        heads = self._lm_head[min(sampled, len(self._lm_head) - 1)]
        return float(self._embedding(np.array([float(tokens)]))[0] + heads)

    def prompt_n2(self, n: int, cached: int = 0) -> float:
        """A prompt chunk's share of `time`'s sum_n2: n^2 + 2nk, or twice its pairs under a padded KV view."""
        step = self.device.step
        return n * n + 2 * n * cached if not step.kv_pad else 2 * prompt_pairs(n, cached, step)

    def passes_time(self, passes: Sequence[tuple[int, int]]) -> float:
        """The token-wise operators (all layers, the embedding lookup, the LM head) of a step the engine runs
        as micro-batches of its own choosing: (rows, rows sampled) per pass."""
        t = 0.0
        for rows, sampled in passes:
            if rows < len(self._pass):
                t += float(self._pass[rows])
            else:
                t += float((self._tabulate_linear(np.array([0.0, float(rows)])) * self.model.num_layers)[1])
            t += float(self._lm_head[min(sampled, len(self._lm_head) - 1)])
        return t + float(self._embedding(np.array([float(sum(rows for rows, _ in passes))]))[0])

    def decode_times(
        self, decodes: int, contexts: np.ndarray, passes: Sequence[tuple[int, int]] | None = None
    ) -> np.ndarray:
        """Step times of decode-only steps of `decodes` sequences holding `contexts` cached tokens in total
        (`passes`: see `passes_time`; default the step model's micro-batches)."""
        if passes is None:
            fixed = self._per_token[decodes] + self._lm_head[decodes] + self.overhead
        else:
            fixed = self.passes_time(passes) + self.overhead
        return fixed + np.maximum(
            contexts * self._decode_flops_ctx,
            contexts * self._decode_bytes_ctx + decodes * self._decode_bytes_seq,
        )

    def time(
        self,
        tokens: int,
        sampled: int,
        decode_ctx: float,
        decodes: int,
        sum_n: float,
        sum_n2: float,
        cached: float = 0.0,
        passes: Sequence[tuple[int, int]] | None = None,
    ) -> float:
        """Seconds for a step of `tokens` new tokens, `sampled` sequences sampled, `decodes` of them decoding
        with `decode_ctx` cached tokens in total, and prompt chunks with sum n and sum n^2 of their lengths
        (n^2 + 2nk for a chunk after k cached tokens), reading `cached` tokens of KV in total. `passes` gives
        (rows, rows sampled) of each micro-batch where the engine splits the step its own way (default: the step
        model's `ubatch_tokens`); it then accounts for the LM head too, and `sampled` plays no part."""
        if passes is not None:
            t = self.passes_time(passes)
        elif tokens < len(self._per_token):
            t = self._per_token[tokens] + self._lm_head[sampled]
        else:  # a prompt longer than the token budget runs alone; off the table, computed directly
            t = sum(
                (self._tabulate_linear(np.array([0.0, float(rows)])) * self.model.num_layers)[1]
                for rows in self.device.step.passes(tokens)
            )
            t += self._embedding(np.array([float(tokens)]))[0] + self._lm_head[sampled]
        if decodes:
            t += max(
                decode_ctx * self._decode_flops_ctx,
                decode_ctx * self._decode_bytes_ctx + decodes * self._decode_bytes_seq,
            )
        if sum_n:
            t += max(
                sum_n2 * self._prefill_flops_n2,
                sum_n * self._prefill_bytes_n + cached * self._prefill_bytes_cached,
            )
        return float(t + (self.overhead if tokens else 0.0))
