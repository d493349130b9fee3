"""Resuming a stream that broke after its first byte: track what the client was given, ask another replica to
continue from there, and splice its events into the client's stream.

The continuation is the original request with the delivered text added: for a completion the prompt grows by
that text (and `max_tokens` shrinks by what was delivered); for a chat the text becomes a final assistant message
with ``continue_final_message: true, add_generation_prompt: false`` (vLLM's names; SGLang reads the same fields,
and llama.cpp's server continues a trailing assistant message by itself). The client sees one stream: the first
stream's `id`, `created`, `model` and `system_fingerprint` on every event, one role delta, and a usage total
that counts the delivered tokens as completion tokens, not as prompt tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]  # C scanner, absent from the stubs
from typing import Any

RESUME_HEADER = "X-Otela-Resume"
"""Request header: ``off`` keeps a broken stream broken (it ends with an error event instead of resuming)."""
MAX_PENDING_BYTES = 1 << 20
"""An SSE event longer than this passes through unparsed, and the stream can no longer resume."""
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_KEPT_FIELDS = ("id", "created", "model", "system_fingerprint")
_decode = json.JSONDecoder().decode
_NOT_PLAIN = re.compile(
    r'"(?:role|usage|error|tool_calls|function_call|reasoning\w*|index"\s*:\s*[^0\s]|index"\s*:\s*0\d'
    r'|logprobs"\s*:\s*[^n\s]|finish_reason"\s*:\s*[^n\s])'
)
"""Keys (or values) that make an event more than plain text, so it goes through the full parse."""
_CHAT_TEXT = re.compile(r'"content"\s*:\s*"')
_COMPLETION_TEXT = re.compile(r'"text"\s*:\s*"')


def wanted(path: str, stream: bool, headers: Mapping[str, str]) -> bool:
    """Whether to follow this request's stream so that a break can resume: a streamed chat or completion whose
    client did not opt out."""
    if not stream or path not in (CHAT_PATH, COMPLETIONS_PATH):
        return False
    return headers.get(RESUME_HEADER, "").strip().lower() not in ("off", "false", "0", "no")


def resumable(path: str, body: Mapping[str, Any]) -> bool:
    """Whether a request can be continued elsewhere: a single answer without log probabilities or an echoed
    prompt, and a prompt the delivered text can extend."""
    for many in ("n", "best_of"):
        if body.get(many) not in (None, 1):
            return False
    if body.get("logprobs") or body.get("top_logprobs") or body.get("echo"):
        return False
    if path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        # Token-id prompts and batches cannot take the delivered text as a suffix.
        return isinstance(prompt, str) or (
            isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        )
    messages = body.get("messages")
    return path == CHAT_PATH and isinstance(messages, list) and bool(messages)


def _max_tokens_key(body: Mapping[str, Any]) -> str | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key
    return None


class StreamSplice:
    """One client stream across the upstream streams that served it: `feed` each upstream chunk and write what
    it returns; after a break `continuation` is the request for the next replica and `restart` starts it.

    Only whole events go to the client, so a stream that breaks mid-event leaves no half event behind; the
    partial event waits here until its end arrives (at most `MAX_PENDING_BYTES`).
    """

    def __init__(self, path: str, headers: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.headers = dict(headers or {})
        """The headers to forward with a continuation."""
        self.chat = path == CHAT_PATH
        self._pieces: list[str] = []
        self.tokens = 0
        """Tokens delivered so far: one per content event, or the first stream's own count when it sent one."""
        self.resumes = 0
        self.blocked: str | None = None
        """Why this stream can no longer resume, once it cannot."""
        self.done = False
        self.fast_path = True
        """Whether plain-text events skip the full parse (tests compare both ways)."""
        self._pending = b""
        self._kept: dict[str, Any] = {}
        self._role_sent = False
        self._prompt_tokens: int | None = None
        self._reported_tokens: int | None = None
        self._delivered = 0

    @property
    def text(self) -> str:
        """The text delivered to the client so far."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]  # joined when asked, not per event: appends stay O(1)
        return self._pieces[0] if self._pieces else ""

    def __repr__(self) -> str:
        return f"<StreamSplice chat={self.chat} tokens={self.tokens} resumes={self.resumes}>"

    @property
    def can_resume(self) -> bool:
        """Whether a break now could be continued on another replica."""
        return self.blocked is None and not self.done

    def feed(self, chunk: bytes) -> bytes:
        """The whole events of `chunk` (and of what was pending) to send to the client, rewritten if spliced."""
        if self.blocked is not None and not self._pending and not self.resumes:
            return chunk  # nothing more to learn or to rewrite
        if not self._pending and chunk.endswith(b"\n\n") and chunk.find(b"\n\n") == len(chunk) - 2:
            if b"\r" not in chunk:
                return self._event(chunk[:-2])  # the usual chunk: one whole event
        data = self._pending + chunk
        if b"\r" in chunk and not self.resumes:
            # Events split by CRLF are left alone rather than held back waiting for an LF boundary.
            self._block("CRLF line ends")
            self._pending = b""
            return data
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            if len(data) > MAX_PENDING_BYTES:
                self._block("an event over the size limit")
                self._pending = b""
                return data
            return b""
        self._pending = data[end + 2 :]
        events = data[: end + 2].split(b"\n\n")[:-1]
        return b"".join(self._event(e) for e in events)

    def flush(self) -> bytes:
        """What is still pending when the upstream stream ended cleanly."""
        rest, self._pending = self._pending, b""
        return rest

    def restart(self) -> None:
        """A new upstream stream follows: a partial event of the broken one is dropped, never shown."""
        self._pending = b""
        self.resumes += 1
        self._delivered = self.tokens

    def continuation(self, original: Mapping[str, Any]) -> dict[str, Any] | None:
        """The request that continues the `original` request after the delivered text; None if none can."""
        if not self.can_resume or not resumable(self.path, original):
            return None
        body = dict(original)
        key = _max_tokens_key(body)
        if key is not None:
            body[key] -= self.tokens
            if body[key] <= 0:
                return None  # nothing left to generate: the break came just before the end
        if not self.text:
            return body  # nothing delivered yet: the original request as it was
        if not self.chat:
            prompt = body["prompt"]
            body["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + self.text
            return body
        messages = list(body["messages"])
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        if body.get("continue_final_message") is True and isinstance(last.get("content"), str):
            # The client already continues its own assistant message: the delivered text extends it.
            messages[-1] = {**last, "content": last["content"] + self.text}
        else:
            messages.append({"role": "assistant", "content": self.text})
        body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        return body

    # --- events ---------------------------------------------------------------------------------------------
    def _block(self, why: str) -> None:
        if self.blocked is None:
            self.blocked = why

    def _event(self, raw: bytes) -> bytes:
        whole = raw + b"\n\n"
        if not raw.startswith(b"data:") or b"\n" in raw:
            # Comments, named events, multi-line data: passed on as they are, but no longer understood.
            if raw.strip() and not raw.startswith(b":"):
                self._block("an event it cannot parse")
            return whole
        payload = raw[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return whole
        try:
            text = payload.decode()
            if self._kept and not self.resumes and self._plain_text(text):
                return whole
            event = _decode(text)
        except ValueError:
            self._block("an event that is not JSON")
            return whole
        if not isinstance(event, dict) or "error" in event:
            self._block("an error event")
            return whole
        if not self.resumes:
            for key in _KEPT_FIELDS:
                if key in event and key not in self._kept:
                    self._kept[key] = event[key]
            self._track(event)
            return whole
        return self._rewrite(event)

    def _plain_text(self, payload: str) -> bool:
        """Take the text of an event that carries nothing but one choice's text, without parsing it whole.

        Most events of a stream are like that, and reading one string costs about half of decoding the event.
        Anything else (a role, usage, a tool call, reasoning, log probabilities, a finish reason, a second
        choice, a null text) is left to the full parse: any of their keys, even inside the text, means no.
        """
        if self.fast_path is False or _NOT_PLAIN.search(payload) is not None:
            return False
        pattern, key = (_CHAT_TEXT, '"content"') if self.chat else (_COMPLETION_TEXT, '"text"')
        found = pattern.search(payload)
        if found is None or payload.count(key) != 1:
            return False
        piece = scanstring(payload, found.end())[0]
        if piece:
            self._pieces.append(piece)
            self.tokens += 1
        return True

    def _track(self, event: dict[str, Any]) -> None:
        """Follow the first stream: its text, role, usage and anything that rules a resume out."""
        usage = event.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self._prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self._reported_tokens = usage["completion_tokens"]
        self._choices(event, first=True)
        if self._reported_tokens is not None:
            self.tokens = max(self.tokens, self._reported_tokens)

    def _choices(self, event: dict[str, Any], *, first: bool) -> bool:
        """Track the choices of `event`; whether it carries anything for the client."""
        choices = event.get("choices")
        if not isinstance(choices, list):
            return False
        useful = False
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                self._block("more than one choice")
                return True
            if choice.get("logprobs") is not None:
                self._block("log probabilities")
            if choice.get("finish_reason") is not None:
                self.done = True
                useful = True
            if self.chat:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    continue
                if delta.get("tool_calls") or delta.get("function_call"):
                    self._block("a tool call")
                if delta.get("reasoning_content") or delta.get("reasoning"):
                    self._block("reasoning text")  # a continuation would take it for the answer
                if "role" in delta:
                    if self._role_sent and not first:
                        del delta["role"]
                    self._role_sent = True
                text = delta.get("content")
                useful = useful or bool(delta)
            else:
                text = choice.get("text")
                useful = useful or bool(text)
            if isinstance(text, str) and text:
                self._pieces.append(text)
                self.tokens += 1
        return useful

    def _rewrite(self, event: dict[str, Any]) -> bytes:
        """An event of a continuation, dressed as the first stream's."""
        for key in _KEPT_FIELDS:
            if key in self._kept:
                event[key] = self._kept[key]
            else:
                event.pop(key, None)
        usage = event.get("usage")
        useful = self._choices(event, first=False)
        if isinstance(usage, dict):
            self._usage(usage)
            useful = True
        if not useful and not (isinstance(event.get("choices"), list) and not event["choices"]):
            return b""  # an empty role-only delta: the client had its role already
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    def _usage(self, usage: dict[str, Any]) -> None:
        """Count the delivered tokens once, as completion tokens: the continuation saw them as prompt."""
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return
        # `tokens` has grown with the continuation's events too: the delivered part is its value at restart.
        delivered = self._delivered
        original = self._prompt_tokens if self._prompt_tokens is not None else max(0, prompt - delivered)
        usage["prompt_tokens"] = original
        usage["completion_tokens"] = delivered + completion
        usage["total_tokens"] = original + delivered + completion
