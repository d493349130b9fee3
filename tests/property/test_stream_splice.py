"""The splice's plain-text shortcut reads exactly what the full parse of each event would have read."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.gateway.resume import CHAT_PATH, COMPLETIONS_PATH, StreamSplice

# Text that stresses the shortcut: quotes, backslashes, the very key names it looks for, non-ASCII, escapes.
TRICKY = st.sampled_from(
    ['"content": "', '"role"', "\\", '\\"', '"usage":', "finish_reason", "é", "😀", "\n", 'index": 1', ""]
)
TEXT = st.lists(st.one_of(st.text(max_size=6), TRICKY), max_size=4).map("".join)


def rarely(one_in: int) -> st.SearchStrategy[bool]:
    """True about once in `one_in` draws (integers would favour their bounds)."""
    return st.sampled_from([False] * (one_in - 1) + [True])


@st.composite
def chat_event(draw: st.DrawFn) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if not draw(rarely(6)):
        delta["content"] = None if draw(rarely(8)) else draw(TEXT)
    if draw(rarely(6)):
        delta["role"] = "assistant"
    if draw(rarely(6)):
        call = {"index": 0, "function": {"name": "f"}}
        delta.update(
            [("tool_calls", [call])] if draw(st.booleans()) else [("function_call", call["function"])]
        )
    if draw(rarely(6)):
        delta["reasoning_content"] = draw(TEXT)
    choice: dict[str, Any] = {"index": 1 if draw(rarely(6)) else 0, "delta": delta}
    choice["logprobs"] = {"content": []} if draw(rarely(6)) else None
    choice["finish_reason"] = "stop" if draw(rarely(6)) else None
    event: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    event["choices"] = [choice]
    if draw(rarely(6)):
        event["error"] = {"message": "engine failed", "code": 500}
    if draw(rarely(6)):
        event["usage"] = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 9))}
    return event


@st.composite
def completion_event(draw: st.DrawFn) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 2 if draw(rarely(6)) else 0,
        "text": None if draw(rarely(8)) else draw(TEXT),
    }
    choice["logprobs"] = {"tokens": ["a"]} if draw(rarely(6)) else None
    choice["finish_reason"] = "length" if draw(rarely(6)) else None
    return {"id": "x1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}


def encode(event: dict[str, Any], compact: bool, ascii_only: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(event, separators=separators, ensure_ascii=ascii_only).encode() + b"\n\n"


def follow(path: str, chunks: list[bytes], fast: bool) -> tuple[Any, ...]:
    """What a splice learnt from the stream, and what it passed on."""
    splice = StreamSplice(path)
    splice.fast_path = fast
    out = b"".join(splice.feed(c) for c in chunks)
    learnt = (splice.text, splice.tokens, splice.blocked, splice.done, splice._role_sent)
    return (*learnt, splice._prompt_tokens, splice._reported_tokens, out)


PLAIN_FIRST = {
    CHAT_PATH: {"id": "c1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]},
    COMPLETIONS_PATH: {"id": "x1", "created": 1, "model": "m", "choices": [{"index": 0, "text": "a"}]},
}


@settings(max_examples=1000, deadline=None)
@given(chat=st.booleans(), data=st.data(), compact=st.booleans(), ascii_only=st.booleans())
def test_shortcut_and_full_parse_agree(
    chat: bool, data: st.DataObject, compact: bool, ascii_only: bool
) -> None:
    """After a plain first event (always fully parsed), a few drawn events: both ways learn and send the same."""
    path = CHAT_PATH if chat else COMPLETIONS_PATH
    events = data.draw(st.lists(chat_event() if chat else completion_event(), min_size=1, max_size=3))
    chunks = [encode(e, compact, ascii_only) for e in [PLAIN_FIRST[path], *events]]
    assert follow(path, chunks, fast=True) == follow(path, chunks, fast=False)
