"""A LLaMA-family model's shape, read from its GGUF metadata."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from opentela.model.weights import field, open_gguf

SUPPORTED_ARCHITECTURES = ("llama",)
"""GGUF `general.architecture` values whose blocks this package runs (Mistral and SmolLM ship as "llama")."""


@dataclass(frozen=True)
class ModelConfig:
    """The numbers that fix a decoder-only LLaMA model's tensors and caches."""

    name: str
    architecture: str
    n_blocks: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    tied_embeddings: bool

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads do not split evenly over {self.n_kv_heads} KV heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, not {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self, n_blocks: int, dtype_bytes: int = 4) -> int:
        """Bytes of K and V one token takes in the caches of `n_blocks` blocks."""
        return 2 * self.n_kv_heads * self.head_dim * dtype_bytes * n_blocks

    def block_weight_bytes(self, dtype_bytes: int = 4) -> int:
        """Bytes of one decoder block's weights (two norms, attention, gated MLP) at `dtype_bytes` each."""
        h, q, kv = self.hidden_size, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        params = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size
        return params * dtype_bytes

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelConfig:
        """Read the config from a GGUF file; ValueError for architectures or RoPE variants not supported."""
        reader = open_gguf(path)
        arch = str(field(reader, "general.architecture", ""))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{path}: architecture {arch or '(none)'!r} is not supported; "
                f"this runs {', '.join(SUPPORTED_ARCHITECTURES)} models only"
            )

        def need(key: str) -> int:
            value = field(reader, f"{arch}.{key}")
            if value is None:
                raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
            return int(value)

        hidden, n_heads = need("embedding_length"), need("attention.head_count")
        n_kv = int(field(reader, f"{arch}.attention.head_count_kv", n_heads))
        head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // n_heads))
        rope_dims = int(field(reader, f"{arch}.rope.dimension_count", head_dim))
        if rope_dims != head_dim:
            raise ValueError(
                f"{path}: partial rotary embeddings ({rope_dims} of {head_dim}) are not supported"
            )
        scaling = field(reader, f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ValueError(f"{path}: RoPE scaling {scaling!r} is not supported")
        tensors = {t.name: t for t in reader.tensors}
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None)
        if vocab is None and "token_embd.weight" in tensors:
            vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml shape: [hidden, vocab]
        if vocab is None:
            raise ValueError(f"{path}: GGUF metadata gives no vocabulary size")
        return cls(
            name=str(field(reader, "general.name", "") or Path(path).stem),
            architecture=arch,
            n_blocks=need("block_count"),
            hidden_size=hidden,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            intermediate_size=need("feed_forward_length"),
            vocab_size=int(vocab),
            rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            context_length=need("context_length"),
            tied_embeddings="output.weight" not in tensors,
        )
