"""Our NumPy SmolLM2 agrees with llama.cpp: same prompt tokens, and >= 95 % of teacher-forced greedy tokens.

The method lives in benchmarks/model_agreement.py (which also prints the figure for the docs): llama.cpp (the
embedded engine, a real process) generates 64 greedy tokens for each of 20 chat prompts, and we count the
positions where our argmax, given the same prefix, is llama.cpp's token.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest

from opentela.model.locate import default_model_path
from opentela.model.tokenizer import GGUFTokenizer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "model_agreement", ROOT / "benchmarks" / "model_agreement.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_numpy_blocks_agree_with_llamacpp() -> None:
    bench = load_benchmark()
    result = await bench.measure(tokens=64, threads=2)
    print(
        f"\nagreement with llama.cpp: {result['agreement']:.2%} ({result['agreeing']}/{result['positions']}), "
        f"worst prompt {result['worst_prompt_agreement']:.1%}, "
        f"median miss margin {result['miss_margin_logits_median']:.3f} logits"
    )
    assert result["prompts"] == 20 and result["positions"] == 20 * 64
    assert result["tokenizer_matches"] == 20, "our tokenizer disagrees with llama.cpp's /tokenize"
    assert result["agreement"] >= 0.95
    # Disagreements are near-ties between two tokens, not a different computation.
    assert result["miss_margin_logits_max"] < 1.0


CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
    [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "  spaced out  \n\n"},
    ],
]


async def test_tokenizer_and_chat_template_match_llamacpp(tmp_path: Path) -> None:
    """Random mixes of words, digit runs, whitespace runs, punctuation, accents, CJK, emoji and control tokens;
    and the chat template rendered as llama.cpp's /apply-template renders it."""
    bench = load_benchmark()
    tok = GGUFTokenizer(default_model_path())
    pieces = [*"abcXYZ 0123456789\n\t.,!?'\"-_()[]{}<>|/\\", "é", "ß", "中文", "😀", "👍🏽", "\u00a0", "   ",
              "\r\n", "'s", "'LL", "<|im_end|>", "<|im_start|>", "  \n", "1,000.5", "don't", "Hello"]  # fmt: skip
    rng = random.Random(20)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(150)]
    async with (
        bench.llamacpp_server(1, tmp_path) as url,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        theirs = [await bench.llamacpp_tokenize(http, url, text) for text in texts]
        rendered = []
        for messages in CHATS:
            async with http.post(f"{url}/apply-template", json={"messages": messages}) as resp:
                rendered.append((await resp.json())["prompt"])
    assert rendered == [tok.apply_chat_template(m) for m in CHATS]
    mismatched = [
        (t, tok.encode(t), ids) for t, ids in zip(texts, theirs, strict=True) if tok.encode(t) != ids
    ]
    assert not mismatched, mismatched[:3]
