"""LocalPipeline: any split into stacks gives the same tokens; the call pattern the split pipeline follows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opentela.model.local import LocalPipeline
from opentela.model.sampling import SamplingParams
from opentela.model.tokenizer import GGUFTokenizer


@pytest.fixture(scope="module")
def three_way(model_path: Path) -> LocalPipeline:
    return LocalPipeline(model_path, splits=[(0, 10), (10, 20), (20, 30)])


def chat(tokenizer: GGUFTokenizer, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def test_one_stack_and_three_stacks_give_identical_tokens(
    pipeline: LocalPipeline, three_way: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    ids = chat(tokenizer, "What is the capital of France?")
    one = pipeline.generate(ids, 12, stop_ids=tokenizer.stop_token_ids)
    assert one == three_way.generate(ids, 12, stop_ids=tokenizer.stop_token_ids)
    assert tokenizer.decode(one) == "The capital of France is Paris."
    assert one[-1] == 2  # the stop token ends the list and is included


def test_sampled_generation_is_reproducible_across_splits(
    pipeline: LocalPipeline, three_way: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    ids = chat(tokenizer, "Tell me a story.")
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    tokens = pipeline.generate(ids, 10, params)
    assert len(tokens) == 10  # no stop ids given: runs to max_new_tokens
    assert tokens == three_way.generate(ids, 10, params) == pipeline.generate(ids, 10, params)


def test_generate_matches_stepping_the_stacks_by_hand(
    three_way: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    """The documented pattern: prompt as one chunk, then one token per step, logits of the last row."""
    ids = chat(tokenizer, "Name a colour.")
    head = three_way.head
    caches = [s.new_cache(len(ids) + 4) for s in three_way.stacks]
    hidden, out = head.embed(ids), []
    for _ in range(4):
        for stack, cache in zip(three_way.stacks, caches, strict=True):
            hidden = stack.forward(hidden, cache)
        out.append(int(np.argmax(head.logits(hidden[-1:])[0])))
        hidden = head.embed(out[-1:])
    assert three_way.generate(ids, 4) == out


def test_bad_splits_and_requests_are_refused(model_path: Path, pipeline: LocalPipeline) -> None:
    with pytest.raises(ValueError, match=r"cover blocks 0\.\.30"):
        LocalPipeline(model_path, splits=[(0, 10), (10, 29)])
    with pytest.raises(ValueError, match="contiguous"):
        LocalPipeline(model_path, splits=[(0, 10), (12, 30)])
    with pytest.raises(ValueError, match="empty"):
        pipeline.generate([], 3)
    with pytest.raises(ValueError, match="at least 1"):
        pipeline.generate([1], 0)
    with pytest.raises(ValueError, match="context of 8192"):
        pipeline.generate([1] * 8190, 5)
