"""Prompt prefixes as chained digests, so that successive turns of one conversation find each other.

A chat's turn n+1 sends turn n's messages, the answer to them and a new user message: turn n's whole prompt is a
prefix of it at a message boundary. So every message boundary gets a digest of everything up to it (one running
hash, copied at each boundary), and a request remembers the digest of its whole prompt; the next turn looks its
boundaries up from the longest down and finds it. Only whole prompts are remembered, never shorter boundaries,
so conversations that merely share a system prompt are not pulled onto one replica. A completion's `prompt`
string has no message boundaries: it gets a boundary every `BLOCK_BYTES` bytes and remembers its last full
block as well as the whole prompt. The model id seeds the chain, so one prompt to two models gives two keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BLOCK_BYTES = 256
"""Boundary spacing in a completion prompt (about 64 tokens): finer costs more digests per request."""
DIGEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class PromptPrefix:
    """A prompt's prefix digests, shortest prefix first, and the ones a request leaves behind for later turns."""

    keys: tuple[bytes, ...]
    remember: tuple[bytes, ...]


def _dump(value: Any) -> bytes:
    if type(value) is str:
        return value.encode()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def _feed(running: Any, message: Any) -> None:
    """Add what of a message identifies it to the running hash: role, content and tool calls, each
    length-prefixed (fed piece by piece, so a long message is never copied).

    Other fields (a reasoning text some clients send back and others drop, `null` extras an SDK adds) would
    make one conversation's turns disagree about the same message, so they are left out.
    """
    if type(message) is dict:
        parts = [_dump(message.get("role", "")), _dump(message.get("content") or "")]
        if message.get("tool_calls"):
            parts.append(_dump(message["tool_calls"]))
    else:
        parts = [_dump(message)]
    for part in parts:
        running.update(len(part).to_bytes(8, "little"))
        running.update(part)


def prompt_prefix(payload: Mapping[str, Any]) -> PromptPrefix | None:
    """The prefix digests of a chat's `messages` or a completion's string `prompt`; None for anything else."""
    running = hashlib.blake2b(str(payload.get("model", "")).encode(), digest_size=DIGEST_BYTES)
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        keys = []
        for message in messages:
            _feed(running, message)
            keys.append(running.copy().digest())
        return PromptPrefix(tuple(keys), (keys[-1],))
    prompt = payload.get("prompt")
    if isinstance(prompt, str) and prompt:
        data = prompt.encode()
        keys = []
        for start in range(0, len(data) - BLOCK_BYTES + 1, BLOCK_BYTES):
            running.update(data[start : start + BLOCK_BYTES])
            keys.append(running.copy().digest())
        remember = keys[-1:]
        if len(data) % BLOCK_BYTES:
            running.update(data[len(keys) * BLOCK_BYTES :])
            keys.append(running.digest())
            remember.append(keys[-1])
        return PromptPrefix(tuple(keys), tuple(remember))
    return None
