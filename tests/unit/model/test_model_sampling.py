"""Token choice: greedy ties, seeded sampling, top-k and top-p cut-offs, and validation of the parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opentela.model.sampling import GREEDY, SamplingParams, greedy, sample


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must not be negative"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"temperature": "1"}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be a non-negative integer"),
        ({"top_k": 2.5}, "top_k must be a non-negative integer"),
        ({"top_k": True}, "top_k must be a non-negative integer"),
        ({"seed": "7"}, "seed must be an integer"),
    ],
)
def test_bad_params_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_greedy_breaks_ties_by_lowest_id() -> None:
    logits = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    assert greedy(logits) == 1
    assert sample(logits, GREEDY) == 1  # no generator needed at temperature 0
    assert sample(logits, SamplingParams(top_k=1), np.random.default_rng(0)) == 1
    assert sample(logits.reshape(1, -1), GREEDY) == 1
    with pytest.raises(ValueError, match="NaN"):
        greedy(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="no logits"):
        greedy(np.array([]))


def test_seeded_sampling_is_reproducible_and_needs_a_generator() -> None:
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    params = SamplingParams(temperature=1.0, seed=42)
    first = [sample(logits, params, r) for r in [params.rng()] for _ in range(20)]
    again = [sample(logits, params, r) for r in [params.rng()] for _ in range(20)]
    assert first == again and len(set(first)) > 5
    with pytest.raises(ValueError, match=r"needs a numpy\.random\.Generator"):
        sample(logits, params)
    with pytest.raises(ValueError, match="no finite maximum"):
        sample(np.full(4, -np.inf), params, np.random.default_rng(0))


def test_frequencies_follow_the_softmax() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    rng = np.random.default_rng(3)
    counts = np.bincount([sample(logits, SamplingParams(), rng) for _ in range(6000)], minlength=3) / 6000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.2], atol=0.03)
    # Temperature 0.5 squares the odds.
    hot = np.bincount(
        [sample(logits, SamplingParams(temperature=0.5), rng) for _ in range(6000)], minlength=3
    )
    np.testing.assert_allclose(hot / 6000, np.array([25, 9, 4]) / 38, atol=0.03)


def test_top_k_and_top_p_cut_the_tail() -> None:
    logits = np.log(np.array([0.05, 0.4, 0.3, 0.25]))
    rng = np.random.default_rng(5)
    top2 = {sample(logits, SamplingParams(top_k=2), rng) for _ in range(500)}
    assert top2 == {1, 2}
    # 0.4 + 0.3 = 0.7 reaches top_p 0.7: only ids 1 and 2 remain.
    nucleus = {sample(logits, SamplingParams(top_p=0.7), rng) for _ in range(500)}
    assert nucleus == {1, 2}
    assert {sample(logits, SamplingParams(top_p=0.1), rng) for _ in range(100)} == {1}
    assert {sample(logits, SamplingParams(), rng) for _ in range(2000)} == {0, 1, 2, 3}
