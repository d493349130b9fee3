"""Prefix hashes of a prompt: chained, salted hashes of its 16-token blocks, the trace's `prefix_hashes`.

Block i's hash is a keyed BLAKE2b of block i-1's hash and block i's token ids, 8 bytes written as 16 hex
characters. Two prompts therefore share block i's hash exactly when they share their first 16 (i + 1) tokens, as
the Mooncake trace's hash ids do, and a hash says nothing of its block to anyone without the deployment's salt (the
key). The prompt is what the engine would see: chat messages rendered with the model's chat template and tokenized
with its tokenizer where the frontend has one; for other models the rendered prompt is cut into 64-byte chunks,
each standing in for a block of about 16 tokens. Nothing here keeps any text.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from opentela.bench.traces import PREFIX_BLOCK_TOKENS

MAX_BLOCKS = 256
"""Blocks hashed per prompt: its first 4,096 tokens (longer prompts rarely share more than that and cost more)."""
BYTES_PER_BLOCK = 64
"""Bytes of rendered prompt per block where the model's tokenizer is unknown (about 16 tokens of English)."""
HASH_BYTES = 8
"""Each hash is BLAKE2b with an 8-byte digest: 16 hex characters."""
MAX_TOKENIZED_CHARS = MAX_BLOCKS * PREFIX_BLOCK_TOKENS * 64
"""Characters of rendered prompt handed to a tokenizer: far more than MAX_BLOCKS blocks of tokens take, so only the
tail past them is cut, and a 4 MiB prompt costs no more to hash than a long one."""

# BLAKE2b's personalization keeps the two kinds of blocks (and the key derivation) apart: a token block and a byte
# chunk never hash alike, even when their bytes happen to be equal.
TOKENS_PERSON = b"otela-tokens"
BYTES_PERSON = b"otela-bytes64"
_SALT_PERSON = b"otela-salt"
_U32 = 2**32
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


class PromptTokenizer(Protocol):
    """What hashing needs of a model's tokenizer (opentela.model.tokenizer.GGUFTokenizer has it)."""

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """The prompt text the model sees for `messages`."""
        ...

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`."""
        ...


def salt_key(salt: str) -> bytes:
    """The BLAKE2b key of a salt of any length (BLAKE2b keys are at most 64 bytes)."""
    return hashlib.blake2b(salt.encode(), digest_size=32, person=_SALT_PERSON).digest()


def chain(key: bytes, blocks: Iterable[bytes], person: bytes = TOKENS_PERSON) -> tuple[str, ...]:
    """Hash each block with the previous block's hash: H(salt, hash of block i-1, block i), as hex."""
    out = []
    previous = b""
    for block in blocks:
        previous = hashlib.blake2b(previous + block, digest_size=HASH_BYTES, key=key, person=person).digest()
        out.append(previous.hex())
    return tuple(out)


def pack(hashes: Sequence[str]) -> bytes:
    """Hashes as stored in a usage row: their digests back to back, 8 bytes each (half the size of the hex)."""
    return bytes.fromhex("".join(hashes))


def unpack(stored: bytes | None) -> tuple[str, ...]:
    """The hex hashes of a usage row's stored digests (none for null)."""
    text = (stored or b"").hex()
    width = 2 * HASH_BYTES
    return tuple(text[i : i + width] for i in range(0, len(text), width))


def token_blocks(ids: Sequence[int]) -> Iterator[bytes]:
    """Token ids in blocks of PREFIX_BLOCK_TOKENS (the last may be shorter), each as little-endian uint32s."""
    ids = ids[: MAX_BLOCKS * PREFIX_BLOCK_TOKENS]
    for start in range(0, len(ids), PREFIX_BLOCK_TOKENS):
        block = ids[start : start + PREFIX_BLOCK_TOKENS]
        yield struct.pack(f"<{len(block)}I", *block)


def byte_blocks(text: str) -> Iterator[bytes]:
    """The text's UTF-8 in chunks of BYTES_PER_BLOCK bytes (the last may be shorter)."""
    # Every character is at least one byte, so this many characters cover every byte that is hashed.
    data = text[: MAX_BLOCKS * BYTES_PER_BLOCK].encode("utf-8", "surrogatepass")[
        : MAX_BLOCKS * BYTES_PER_BLOCK
    ]
    for start in range(0, len(data), BYTES_PER_BLOCK):
        yield data[start : start + BYTES_PER_BLOCK]


def token_hashes(key: bytes, ids: Sequence[int]) -> tuple[str, ...]:
    """Chained hashes of token ids."""
    return chain(key, token_blocks(ids), TOKENS_PERSON)


def text_hashes(key: bytes, text: str) -> tuple[str, ...]:
    """Chained hashes of a rendered prompt cut into byte chunks (no tokenizer for its model)."""
    return chain(key, byte_blocks(text), BYTES_PERSON)


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    # An image or audio part stands in by a digest of itself: equal parts render alike, different ones do not.
    digest = hashlib.blake2b(
        json.dumps(part, sort_keys=True, default=str).encode(), digest_size=8
    ).hexdigest()
    kind = part.get("type") if isinstance(part, dict) else None
    return f"<{kind if isinstance(kind, str) else 'part'} {digest}>"


def chat_messages(messages: Any) -> list[dict[str, str]] | None:
    """Role and text of each message (content parts joined), or None when `messages` is no list of messages."""
    if not isinstance(messages, list) or not messages:
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return None
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(_part_text(p) for p in content)
        elif content is None or isinstance(content, str):
            text = content or ""
        else:
            return None
        out.append({"role": m["role"], "content": text})
    return out


def render_chat(messages: Sequence[Mapping[str, str]], tools: Any = None) -> str:
    """A fixed rendering of a chat for models whose template the frontend does not have (ChatML's shape)."""
    head = f"<|tools|>\n{json.dumps(tools, sort_keys=True, default=str)}\n" if tools else ""
    return head + "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def prompt_hashes(
    endpoint: str, body: Mapping[str, Any], key: bytes, tokenizer: PromptTokenizer | None
) -> tuple[str, ...] | None:
    """The prefix hashes of a chat or completion request's prompt; None where there is no single prompt (an
    embedding, a batch of prompts) or the tokenizer refuses it (a chat template that rejects a role)."""
    if endpoint == CHAT_PATH:
        messages = chat_messages(body.get("messages"))
        if messages is None:
            return None
        tools = body.get("tools")
        if tokenizer is None:
            return text_hashes(key, render_chat(messages, tools))
        return _tokenized(key, tokenizer, messages, tools)
    if endpoint != COMPLETIONS_PATH:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_hashes(key, prompt) if tokenizer is None else _tokenized(key, tokenizer, prompt)
    if isinstance(prompt, list) and prompt:
        ids = prompt[: MAX_BLOCKS * PREFIX_BLOCK_TOKENS]
        if all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _U32 for t in ids):
            return token_hashes(key, ids)  # already token ids
    return None


def _tokenized(
    key: bytes, tokenizer: PromptTokenizer, prompt: str | list[dict[str, str]], tools: Any = None
) -> tuple[str, ...] | None:
    try:
        if isinstance(prompt, str):
            text = prompt
        else:
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tools=tools or None)
        ids = tokenizer.encode(text[:MAX_TOKENIZED_CHARS])
    except Exception:  # a template that raises on these messages, text the tokenizer cannot take: no hashes
        return None
    return token_hashes(key, ids)
