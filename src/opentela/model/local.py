"""The whole model in one process, as a chain of block stacks: the reference a split pipeline must match."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from opentela.model.backend import Backend
from opentela.model.blocks import BlockStack
from opentela.model.config import ModelConfig
from opentela.model.head import ClientHead
from opentela.model.sampling import GREEDY, SamplingParams, sample
from opentela.model.threads import DEFAULT_THREADS, set_blas_threads

DEFAULT_SPLITS = ((0, 10), (10, 20), (20, 30))


def check_generation(prompt_ids: Sequence[int], max_new_tokens: int, context_length: int) -> int:
    """The cache length a generation needs; ValueError for an empty prompt, no tokens, or too long a total."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    max_length = len(prompt_ids) + max_new_tokens
    if max_length > context_length:
        raise ValueError(f"{max_length} tokens exceed the model's context of {context_length}")
    return max_length


def generate_tokens(
    head: ClientHead,
    run: Callable[[np.ndarray], np.ndarray],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = GREEDY,
    stop_ids: Iterable[int] = (),
) -> list[int]:
    """The reference step pattern: the prompt as one chunk through `run`, then one token per step; logits of the
    last row only, tokens from one generator seeded by `sampling` (a stop token ends the list, included)."""
    stops = set(stop_ids)
    rng = np.random.default_rng(sampling.seed)
    hidden = head.embed(list(prompt_ids))
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = sample(head.logits(run(hidden)[-1:]).reshape(-1), sampling, rng)
        out.append(token)
        if token in stops:
            break
        hidden = head.embed([token])
    return out


class LocalPipeline:
    """Embedding, block stacks in order, LM head, with the exact step pattern of the split pipeline.

    `generate` runs the embedded prompt through every stack as one chunk, then one token per step; logits
    come from the last row alone (``logits(out[-1:])``) and tokens from `sample` with one generator seeded
    from the sampling params. A split pipeline that makes the same calls with the same shapes gets the same
    bits, so it must keep to this pattern (no re-chunking of the prompt, no batching of sessions), and run with
    the servers' BLAS thread count, which `threads` sets for the whole process (model/threads.py).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        splits: Sequence[tuple[int, int]] = DEFAULT_SPLITS,
        backend: str | Backend = "numpy",
        threads: int | None = DEFAULT_THREADS,
    ) -> None:
        # The servers' thread count, so the reference computes the same bits (model/threads.py).
        set_blas_threads(threads)
        self.path = str(path)
        self.config = ModelConfig.from_gguf(path)
        spans = [(int(a), int(b)) for a, b in splits]
        if not spans or spans[0][0] != 0 or spans[-1][1] != self.config.n_blocks:
            raise ValueError(f"splits must cover blocks 0..{self.config.n_blocks}, got {spans}")
        if any(prev[1] != nxt[0] for prev, nxt in itertools.pairwise(spans)):
            raise ValueError(f"splits must be contiguous and in order, got {spans}")
        self.head = ClientHead(path)
        self.stacks = [BlockStack(path, a, b, backend) for a, b in spans]

    def __repr__(self) -> str:
        return f"<LocalPipeline {self.config.name} splits={[(s.start, s.end) for s in self.stacks]}>"

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        stop_ids: Iterable[int] = (),
    ) -> list[int]:
        """New token ids after `prompt_ids` (at most `max_new_tokens`; a token in `stop_ids` ends the list)."""
        max_length = check_generation(prompt_ids, max_new_tokens, self.config.context_length)
        caches = [stack.new_cache(max_length) for stack in self.stacks]

        def run(hidden: np.ndarray) -> np.ndarray:
            for stack, cache in zip(self.stacks, caches, strict=True):
                hidden = stack.forward(hidden, cache)
            return hidden

        return generate_tokens(self.head, run, prompt_ids, max_new_tokens, sampling, stop_ids)

    def last_hidden(self, token_ids: Sequence[int]) -> np.ndarray:
        """Hidden states ``[T, hidden]`` after the last block for `token_ids` run as one chunk (no cache kept)."""
        hidden = self.head.embed(list(token_ids))
        for stack in self.stacks:
            hidden = stack.forward(hidden, stack.new_cache(len(token_ids)))
        return hidden
