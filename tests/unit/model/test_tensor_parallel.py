"""The tensor-parallel cut of the blocks: the same model as the fused stack, and the same bits however units are
spread over holders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opentela.model.local import LocalPipeline
from opentela.model.tensor_parallel import ShardedBlocks, TensorParallelReference, reduce_partials
from opentela.model.tokenizer import GGUFTokenizer


@pytest.fixture(scope="module")
def reference(model_path: Path) -> TensorParallelReference:
    return TensorParallelReference(model_path)


def test_sharded_blocks_compute_the_fused_model(
    reference: TensorParallelReference, pipeline: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    ids = tokenizer.encode("The capital of France is")
    caches = [reference.blocks.new_head_cache(len(ids)) for _ in range(reference.config.n_kv_heads)]
    sharded = reference.step(reference.head.embed(ids), caches)
    fused = pipeline.last_hidden(ids)
    # Different summation orders, so not the same bits; the same function to float32 rounding.
    assert np.allclose(sharded, fused, rtol=1e-3, atol=1e-3)
    assert reference.generate(ids, 6) == pipeline.generate(ids, 6)


def test_units_held_apart_give_the_same_bits_as_held_together(
    reference: TensorParallelReference, model_path: Path, tokenizer: GGUFTokenizer
) -> None:
    """Two holders with disjoint units (as two ranks) reproduce one holder's block output exactly."""
    a, b = ShardedBlocks(model_path), ShardedBlocks(model_path)
    a.load(heads=[0, 2], shards=[0, 1, 2])
    b.load(heads=[1], shards=[3, 4, 5])
    ids = tokenizer.encode("Once upon a time")
    x = reference.head.embed(ids)
    whole = reference.blocks
    caches = {h: whole.new_head_cache(len(ids)) for h in range(3)}
    split_caches = {h: whole.new_head_cache(len(ids)) for h in range(3)}
    layer = 4
    normed = whole.attention_input(layer, x)
    together = reduce_partials([whole.head_partial(layer, normed, h, caches[h])[0] for h in range(3)])
    holder = {0: a, 1: b, 2: a}
    apart = reduce_partials(
        [
            holder[h].head_partial(layer, holder[h].attention_input(layer, x), h, split_caches[h])[0]
            for h in range(3)
        ]
    )
    assert np.array_equal(together, apart)
    ffn_normed = whole.ffn_input(layer, x)
    together = reduce_partials([whole.shard_partial(layer, ffn_normed, s) for s in range(6)])
    apart = reduce_partials(
        [
            (a if s < 3 else b).shard_partial(layer, (a if s < 3 else b).ffn_input(layer, x), s)
            for s in range(6)
        ]
    )
    assert np.array_equal(together, apart)


def test_loading_reports_only_new_units_and_dropping_frees_them(model_path: Path) -> None:
    blocks = ShardedBlocks(model_path)
    first = blocks.load(heads=[0], shards=[1])
    assert first > 0 and blocks.weight_bytes == first
    assert blocks.load(heads=[0], shards=[1]) == 0  # held already
    blocks.drop(heads=[0])
    assert sorted(blocks.heads) == [] and sorted(blocks.shards) == [1]
    with pytest.raises(ValueError, match="KV head 7"):
        blocks.load(heads=[7])
    with pytest.raises(ValueError, match="equal shards"):
        ShardedBlocks(model_path, n_ffn_shards=7)
