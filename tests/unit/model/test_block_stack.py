"""BlockStack on the real SmolLM2 weights: KV-cache correctness, batching, sub-ranges and step validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opentela.model.blocks import BlockStack
from opentela.model.head import ClientHead
from opentela.model.kv_cache import SessionCache, UnknownSession

IDS = [1, 4093, 198, 19556, 216, 33, 34, 35, 36, 37, 256, 905, 10095, 256, 8866, 1792, 2, 198, 1, 520]


def test_prefill_then_decode_equals_recomputing_the_whole_sequence(
    stack: BlockStack, head: ClientHead
) -> None:
    full = stack.forward(head.embed(IDS), stack.new_cache(len(IDS)))
    cache = stack.new_cache(len(IDS))
    parts = [stack.forward(head.embed(IDS[:12]), cache)]
    parts += [stack.forward(head.embed(IDS[i : i + 1]), cache) for i in range(12, 16)]
    parts.append(stack.forward(head.embed(IDS[16:]), cache))  # a second chunk after single steps
    assert cache.length == len(IDS)
    stepped = np.concatenate(parts)
    assert stepped.shape == (len(IDS), 576) and stepped.dtype == np.float32
    # Hidden states reach the thousands (outlier channels); float32 sums in another order differ ~1e-6 of that.
    np.testing.assert_allclose(stepped, full, rtol=1e-4, atol=0.05)
    np.testing.assert_allclose(head.logits(stepped), head.logits(full), rtol=0, atol=1e-3)


def test_a_cache_is_needed_for_context(stack: BlockStack, head: ClientHead) -> None:
    """The last token alone, without its prefix in the cache, gives another answer (the cache is used)."""
    full = stack.forward(head.embed(IDS), stack.new_cache(len(IDS)))
    alone = stack.forward(head.embed(IDS[-1:]), stack.new_cache(1))
    assert not np.allclose(alone[0], full[-1], atol=1e-2)


def test_same_steps_give_identical_bits(stack: BlockStack, head: ClientHead) -> None:
    runs = []
    for capacity in (len(IDS), 64):  # preallocated size must not matter
        cache = stack.new_cache(capacity)
        out = [stack.forward(head.embed(IDS[:10]), cache)]
        out += [stack.forward(head.embed([t]), cache) for t in IDS[10:14]]
        runs.append(np.concatenate(out))
    assert np.array_equal(runs[0], runs[1])


def test_forward_many_matches_separate_steps(stack: BlockStack, head: ClientHead) -> None:
    a, b = stack.new_cache(32), stack.new_cache(32)
    a2, b2 = stack.new_cache(32), stack.new_cache(32)
    stack.forward(head.embed(IDS[:8]), a)
    stack.forward(head.embed(IDS[:8]), a2)
    stack.forward(head.embed(IDS[5:9]), b)
    stack.forward(head.embed(IDS[5:9]), b2)
    xs = [head.embed([IDS[9]]), head.embed(IDS[10:13])]  # different positions and row counts
    batched = stack.forward_many([(xs[0], a), (xs[1], b)])
    alone = [stack.forward(xs[0], a2), stack.forward(xs[1], b2)]
    assert [o.shape for o in batched] == [(1, 576), (3, 576)]
    assert (a.length, b.length) == (9, 7)
    for got, want in zip(batched, alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=0.05)
        np.testing.assert_allclose(head.logits(got), head.logits(want), rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="once in a batch"):
        stack.forward_many([(xs[0], a), (xs[0], a)])
    assert stack.forward_many([]) == []


def test_sub_ranges_chain_to_the_whole_range(model_path: Path, stack: BlockStack, head: ClientHead) -> None:
    x = head.embed(IDS[:6])
    whole = stack.forward(x, stack.new_cache(6))
    mid = stack.forward(x, SessionCache(7, stack.cache_layout, 6), 0, 7)
    tail = stack.forward(mid, SessionCache(23, stack.cache_layout, 6), 7, 30)
    assert np.array_equal(tail, whole)  # same operations, same shapes: same bits
    upper = BlockStack(model_path, 7, 30)
    assert np.array_equal(upper.forward(mid, upper.new_cache(6)), whole)
    assert (upper.start, upper.end, upper.n_blocks) == (7, 30, 23)


def test_bad_steps_are_refused_and_leave_the_cache_alone(stack: BlockStack, head: ClientHead) -> None:
    cache = stack.new_cache(4)
    stack.forward(head.embed(IDS[:3]), cache)
    with pytest.raises(ValueError, match="exceed the session's 4"):
        stack.forward(head.embed(IDS[:2]), cache)
    with pytest.raises(ValueError, match="float32"):
        stack.forward(head.embed([5]).astype(np.float64), cache)
    with pytest.raises(ValueError, match=r"float32 \[tokens, 576\]"):
        stack.forward(np.zeros((1, 100), np.float32), cache)
    with pytest.raises(ValueError, match="holds 30 blocks, the step runs 10"):
        stack.forward(head.embed([5]), cache, 0, 10)
    with pytest.raises(ValueError, match="not within"):
        stack.forward(head.embed([5]), cache, 0, 31)
    assert cache.length == 3
    cache.release()
    with pytest.raises(UnknownSession):
        stack.forward(head.embed([5]), cache)


def test_block_range_is_checked(model_path: Path) -> None:
    with pytest.raises(ValueError, match="outside the model's 30 blocks"):
        BlockStack(model_path, 25, 31)
    with pytest.raises(ValueError, match="outside"):
        BlockStack(model_path, 3, 3)


def test_head_embeds_and_scores(head: ClientHead) -> None:
    rows = head.embed([0, 5, 49151])
    assert rows.shape == (3, 576) and rows.dtype == np.float32
    logits = head.logits(rows)
    assert logits.shape == (3, 49152)
    assert head.logits(rows[1]).shape == (49152,)
    np.testing.assert_allclose(head.logits(rows[1:2])[0], logits[1], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"token ids must be in 0\.\.49151"):
        head.embed([49152])
    with pytest.raises(ValueError, match="no tokens"):
        head.embed([])
    with pytest.raises(ValueError, match="must end in 576"):
        head.logits(np.zeros((1, 5), np.float32))
