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
