"""Prefix hashes of prompts: chained, salted, capped; over the model's own tokens where the frontend has its
tokenizer (SmolLM2's GGUF), over 64-byte chunks of the rendered prompt otherwise."""

from __future__ import annotations

import math
from typing import Any

import pytest

from opentela.bench.traces import PREFIX_BLOCK_TOKENS
from opentela.frontend.prefix_hashes import (
    BYTES_PER_BLOCK,
    CHAT_PATH,
    COMPLETIONS_PATH,
    MAX_BLOCKS,
    pack,
    prompt_hashes,
    render_chat,
    salt_key,
    text_hashes,
    token_hashes,
    unpack,
)
from opentela.frontend.trace_recorder import shipped_tokenizer
from opentela.model.locate import SMOLLM2_ID

KEY = salt_key("deployment-a")


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many leading hashes two prompts share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_hashes_are_deterministic_for_a_salt_and_differ_across_salts() -> None:
    ids = list(range(1000, 1100))
    first = token_hashes(KEY, ids)
    assert first == token_hashes(salt_key("deployment-a"), ids)
    assert len(first) == math.ceil(100 / PREFIX_BLOCK_TOKENS)
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in first)
    other = token_hashes(salt_key("deployment-b"), ids)
    assert not set(first) & set(other)
    assert not set(text_hashes(KEY, "x" * 300)) & set(text_hashes(salt_key("deployment-b"), "x" * 300))


def test_equal_prefixes_share_leading_hashes_and_diverge_after_the_first_differing_block() -> None:
    a = list(range(100))
    b = [*a[:40], 7777, *a[41:]]  # token 40 is in block 2; blocks 3 onwards are equal again
    ha, hb = token_hashes(KEY, a), token_hashes(KEY, b)
    assert ha[:2] == hb[:2]
    assert all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))  # chained: never equal again
    assert (
        token_hashes(KEY, a[:32]) == ha[:2]
    )  # a prompt that is a prefix of another shares all its full blocks
    text = "The quick brown fox jumps over the lazy dog. " * 10
    ta, tb = text_hashes(KEY, text), text_hashes(KEY, text[:200] + "!" + text[201:])
    assert len(ta) == math.ceil(len(text) / BYTES_PER_BLOCK)
    assert _shared(ta, tb) == 200 // BYTES_PER_BLOCK and all(
        x != y for x, y in zip(ta[3:], tb[3:], strict=True)
    )


def test_token_and_byte_blocks_never_hash_alike() -> None:
    # 16 token ids packed as uint32 are 64 bytes, like one byte chunk; the two kinds are hashed apart all the same.
    ids = list(range(16))
    packed = b"".join(i.to_bytes(4, "little") for i in ids).decode("latin-1")
    assert token_hashes(KEY, ids) != text_hashes(KEY, packed)


def test_the_hashed_length_is_capped() -> None:
    long = list(range(MAX_BLOCKS * PREFIX_BLOCK_TOKENS + 500))
    hashes = token_hashes(KEY, long)
    assert len(hashes) == MAX_BLOCKS == 256
    assert (
        token_hashes(KEY, [*long[:-1], 3]) == hashes
    )  # what differs past the first 4,096 tokens is not seen
    assert len(text_hashes(KEY, "y" * (MAX_BLOCKS * BYTES_PER_BLOCK * 10))) == MAX_BLOCKS


class FakeTokenizer:
    """Renders a chat its own way and gives each character its code point as a token."""

    def __init__(self) -> None:
        self.rendered: list[str] = []

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True, **extra: Any) -> str:
        text = "".join(f"[{m['role']}]{m['content']}" for m in messages)
        text += "[assistant]" if add_generation_prompt else ""
        self.rendered.append(text)
        return text

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_chats_and_completions_hash_what_the_model_sees() -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]
    chat = {"model": "m", "messages": messages}
    fake = FakeTokenizer()
    assert prompt_hashes(CHAT_PATH, chat, KEY, fake) == token_hashes(
        KEY, [ord(c) for c in "[system]You are terse.[user]Hi![assistant]"]
    )
    # Without the model's tokenizer: the fixed rendering, in byte chunks.
    assert prompt_hashes(CHAT_PATH, chat, KEY, None) == text_hashes(KEY, render_chat(messages))
    # Content parts: text parts read as the string they join to; any other part by a digest of itself.
    split = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]
    parts = {"messages": [messages[0], {"role": "user", "content": split}]}
    assert prompt_hashes(CHAT_PATH, parts, KEY, None) == prompt_hashes(CHAT_PATH, chat, KEY, None)
    image = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
    }
    other = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}],
    }
    assert prompt_hashes(CHAT_PATH, {"messages": [image]}, KEY, None) != prompt_hashes(
        CHAT_PATH, {"messages": [other]}, KEY, None
    )
    assert prompt_hashes(COMPLETIONS_PATH, {"prompt": "Once upon"}, KEY, fake) == token_hashes(
        KEY, [ord(c) for c in "Once upon"]
    )
    assert prompt_hashes(COMPLETIONS_PATH, {"prompt": ["Once upon"]}, KEY, None) == text_hashes(
        KEY, "Once upon"
    )
    assert prompt_hashes(COMPLETIONS_PATH, {"prompt": [5, 6, 7]}, KEY, None) == token_hashes(KEY, [5, 6, 7])
    for endpoint, body in (
        (COMPLETIONS_PATH, {"prompt": ["a", "b"]}),  # a batch: no single prompt
        (COMPLETIONS_PATH, {"prompt": [-1, 2]}),
        ("/v1/embeddings", {"input": "hello"}),
        (CHAT_PATH, {"messages": "hello"}),
        (CHAT_PATH, {"messages": [{"content": "no role"}]}),
    ):
        assert prompt_hashes(endpoint, body, KEY, fake) is None


def test_a_template_that_refuses_the_messages_gives_no_hashes() -> None:
    class Refusing(FakeTokenizer):
        def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True, **extra: Any) -> str:
            raise ValueError("unknown role")

    assert prompt_hashes(CHAT_PATH, {"messages": [{"role": "tool", "content": "x"}]}, KEY, Refusing()) is None


def test_smollm2_prompts_are_hashed_over_its_own_tokens() -> None:
    tokenizer = shipped_tokenizer(SMOLLM2_ID)
    if tokenizer is None:
        pytest.skip("the SmolLM2 GGUF is not installed")
    assert (
        shipped_tokenizer("HuggingFaceTB/" + SMOLLM2_ID) is tokenizer
    )  # loaded once, by its served name too
    assert shipped_tokenizer("Qwen3-32B") is None
    system = "You are a careful assistant who answers questions about the solar system. " * 8
    a = [{"role": "system", "content": system}, {"role": "user", "content": "How far is Mars?"}]
    b = [{"role": "system", "content": system}, {"role": "user", "content": "Name Jupiter's moons."}]
    ids_a = tokenizer.encode(tokenizer.apply_chat_template(a))
    ids_b = tokenizer.encode(tokenizer.apply_chat_template(b))
    ha = prompt_hashes(CHAT_PATH, {"messages": a}, KEY, tokenizer)
    hb = prompt_hashes(CHAT_PATH, {"messages": b}, KEY, tokenizer)
    assert ha == token_hashes(KEY, ids_a) and len(ha) == math.ceil(len(ids_a) / PREFIX_BLOCK_TOKENS)
    common = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    assert common > 5 * PREFIX_BLOCK_TOKENS  # the long system prompt
    assert _shared(ha, hb) == common // PREFIX_BLOCK_TOKENS


def test_hashes_are_stored_as_their_digests_and_read_back_as_hex() -> None:
    hashes = token_hashes(KEY, list(range(50)))
    stored = pack(hashes)
    assert len(stored) == 8 * len(hashes) and unpack(stored) == hashes
    assert unpack(None) == () == unpack(b"")
