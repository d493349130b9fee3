"""Token counts: from the engine's `usage` when it reports one, else an estimate that says it is one.

The estimate itself is the OpenAI edge's (`opentela.openai_edge`), the one the gateway's load estimates use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stream",
)


@dataclass
class TokenCount:
    """Input and output tokens of one request, and whether they are an estimate."""

    input: int = 0
    output: int = 0
    estimated: bool = True


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters of a request (kept for the anonymized trace), never its content."""
    return {k: body[k] for k in SAMPLING_FIELDS if k in body and isinstance(body[k], (int, float, bool))}


def usage_from(payload: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from an OpenAI `usage` object, if the payload has one."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    completion = usage.get("completion_tokens", 0)
    return usage["prompt_tokens"], completion if isinstance(completion, int) else 0


def chunk_text(payload: dict[str, Any]) -> str:
    """The generated text a stream chunk carries (chat delta or completion text)."""
    parts = []
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            parts.append(delta["content"])
        elif isinstance(choice.get("text"), str):
            parts.append(choice["text"])
    return "".join(parts)


THINK_TAG = "<think>"
"""How reasoning models served without a reasoning parser open their reasoning, in the answer text itself."""


class ReasoningSeen:
    """Whether an answer reasoned, read from its stream chunks in order or from the whole answer.

    True once a choice carries reasoning text (`reasoning_content`, or `reasoning` as some engines name it) or its
    first non-blank text opens with <think>; False when text came without either; None while nothing told.
    """

    def __init__(self) -> None:
        self.value: bool | None = None
        self._text_seen = False

    def feed(self, payload: Any) -> None:
        """Take one stream chunk or a whole answer into account."""
        if not isinstance(payload, dict):
            return
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            part = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
            if isinstance(part, dict):
                if part.get("reasoning_content") or part.get("reasoning"):
                    self.value = True
                text = part.get("content")
            else:
                text = choice.get("text")
            if isinstance(text, str) and text.strip() and not self._text_seen:
                self._text_seen = True
                if self.value is None:
                    self.value = text.lstrip().startswith(THINK_TAG)


class SseEvents:
    """Splits a byte stream of server-sent events into whole events (the bytes of each, blank line included)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """Whole events completed by `chunk`."""
        self._buf += chunk.replace(b"\r\n", b"\n")
        events = []
        while (end := self._buf.find(b"\n\n")) >= 0:
            events.append(self._buf[: end + 2])
            self._buf = self._buf[end + 2 :]
        return events

    def rest(self) -> bytes:
        """Bytes left over after the stream ended (an unterminated last event)."""
        rest, self._buf = self._buf, b""
        return rest


def event_data(event: bytes) -> Any:
    """The JSON of an event's data lines; the string "[DONE]" for the end marker; None if not JSON."""
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    data = b"\n".join(lines)
    if data == b"[DONE]":
        return "[DONE]"
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
