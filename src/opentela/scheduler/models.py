"""The model catalog: decoder architectures read from Hugging Face config.json files."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from opentela.errors import ConfigError

BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 2 / 128,  # group-wise int4 (GPTQ/AWQ, group 128) with fp16 scales
    "q4_1": 20 / 32,  # llama.cpp Q4_1: 32 weights in 16 bytes plus fp16 scale and minimum
    "q8_0": 34 / 32,
}
"""Storage bytes per element of the weight and KV-cache formats the simulator knows."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, enough to count its operators' FLOPs and bytes."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.num_experts > 0

    @property
    def attention_params(self) -> int:
        """Weights of q, k, v and o projections in one layer."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return 2 * q + kv

    @property
    def mlp_params(self) -> int:
        """Weights of the gated MLP (or all experts and the router) in one layer."""
        if self.is_moe:
            return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size + (
                self.hidden_size * self.num_experts
            )
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_mlp_params(self) -> int:
        """MLP weights one token touches (the routed experts only, for a MoE)."""
        if self.is_moe:
            return self.experts_per_token * 3 * self.hidden_size * self.moe_intermediate_size
        return self.mlp_params

    @property
    def embedding_params(self) -> int:
        """Input embedding plus lm_head (once if they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """Total parameters (norm weights included)."""
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.num_layers * (self.attention_params + self.mlp_params) + self.embedding_params + norms

    def weight_bytes(self, dtype: str = "fp16") -> float:
        """Bytes of all weights stored in `dtype`."""
        return self.num_params * BYTES_PER_ELEMENT[dtype]

    def kv_bytes_per_token(self, dtype: str = "fp16") -> float:
        """KV-cache bytes one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BYTES_PER_ELEMENT[dtype]


def spec_from_config(config: Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """Build a ModelSpec from the fields of a Hugging Face config.json."""
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
        intermediate = int(config["intermediate_size"])
        return ModelSpec(
            name=name or str(config.get("_name_or_path", "model")).rsplit("/", 1)[-1],
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=intermediate,
            vocab_size=int(config["vocab_size"]),
            max_positions=int(config.get("max_position_embeddings", 4096)),
            num_experts=experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=int(config.get("moe_intermediate_size") or intermediate) if experts else 0,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise ConfigError(f"config.json of {name or 'model'} lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config.json of {name or 'model'}: {exc}") from None


def _shipped() -> dict[str, Any]:
    return {
        f.name.removesuffix(".json"): f
        for f in resources.files("opentela.scheduler").joinpath("data/models").iterdir()
        if f.name.endswith(".json")
    }


def builtin_models() -> list[str]:
    """Names of the models whose config.json ships with the package."""
    return sorted(_shipped())


def _normalise(name: str) -> str:
    return name.rsplit("/", 1)[-1].lower().removesuffix("-hf")


@cache
def load_model(name_or_path: str) -> ModelSpec:
    """A shipped model by name (``Llama-2-13b``, ``meta-llama/Llama-2-13b-hf``) or any config.json path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_dir():
        file = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read model config {file}: {exc}") from None
        return spec_from_config(config, name=path.stem if path.suffix == ".json" else path.name)
    wanted = _normalise(name_or_path)
    for stem, file in _shipped().items():
        if _normalise(stem) == wanted or _normalise(stem).removesuffix("-instruct") == wanted:
            return spec_from_config(json.loads(file.read_text()), name=stem)
    raise ConfigError(
        f"unknown model {name_or_path!r}; give a config.json path or one of: {', '.join(builtin_models())}"
    )
