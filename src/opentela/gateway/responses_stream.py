"""The Responses event stream of a translated request, written as the chat completion's stream arrives.

OpenAI's order, each event an SSE with `event:` and `data:` lines and a growing `sequence_number`:
`response.created`, `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta` per chunk of text, `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed` (or `response.incomplete` when the output limit cut the
answer short) with the usage. No `[DONE]` follows: the Responses API ends a stream with its terminal event.
"""

from __future__ import annotations

import json
from typing import Any

from opentela.gateway.responses import (
    ResponsesAnswer,
    chat_usage,
    finish_status,
    message_item,
    new_id,
    response_object,
)


def sse_event(kind: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event."""
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


class ResponsesEventStream:
    """Reads chat completion chunks (SSE bytes, in any pieces) and writes the Responses events they make.

    An upstream error event is passed on as it is (the SDKs raise it); anything that is not a chat chunk is
    skipped. `close` ends a stream the engine ended without `[DONE]`.
    """

    def __init__(self, answer: ResponsesAnswer) -> None:
        self.answer = answer
        self.item_id = new_id("msg")
        self._buf = b""
        self._seq = 0
        self._started = False
        self._item_open = False
        self._done = False
        self._text: list[str] = []
        self._finish: Any = None
        self._usage: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<ResponsesEventStream {self.answer.response_id} seq={self._seq} done={self._done}>"

    @property
    def done(self) -> bool:
        """Whether the terminal event was written."""
        return self._done

    def feed(self, chunk: bytes) -> bytes:
        """The Responses events that the whole chat events completed by `chunk` make."""
        # Normalised on the buffer, not the chunk: a CRLF may be cut between two chunks.
        self._buf = (self._buf + chunk).replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while (end := self._buf.find(b"\n\n")) >= 0:
            event, self._buf = self._buf[:end], self._buf[end + 2 :]
            self._event(event, out)
        return b"".join(out)

    def close(self) -> bytes:
        """The closing events, when the stream ended without `[DONE]` (nothing once it was seen)."""
        out: list[bytes] = []
        if self._buf.strip():
            self._event(self._buf, out)
            self._buf = b""
        if not self._done:
            self._finish_stream(out)
        return b"".join(out)

    # --- internals --------------------------------------------------------------------------------------------
    def _emit(self, out: list[bytes], kind: str, **fields: Any) -> None:
        out.append(sse_event(kind, {"type": kind, "sequence_number": self._seq, **fields}))
        self._seq += 1

    def _response(self, status: str, output: list[dict[str, Any]], incomplete: str | None = None) -> Any:
        a = self.answer
        return response_object(
            a.req,
            a.model,
            a.response_id,
            a.created_at,
            status=status,
            output=output,
            usage=self._usage,
            incomplete=incomplete,
        )

    def _start(self, out: list[bytes]) -> None:
        if not self._started:
            self._started = True
            self._emit(out, "response.created", response=self._response("in_progress", []))
            self._emit(out, "response.in_progress", response=self._response("in_progress", []))

    def _open_item(self, out: list[bytes]) -> None:
        self._start(out)
        if not self._item_open:
            self._item_open = True
            item = message_item(self.item_id, "", "in_progress")
            item["content"] = []
            self._emit(out, "response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._emit(
                out,
                "response.content_part.added",
                item_id=self.item_id,
                output_index=0,
                content_index=0,
                part=part,
            )

    def _event(self, event: bytes, out: list[bytes]) -> None:
        if self._done:
            return
        lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if not lines:
            return
        data = b"\n".join(lines)
        if data == b"[DONE]":
            self._finish_stream(out)
            return
        try:
            chunk = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("error"), dict):
            out.append(event + b"\n\n")  # the engine's error event, as it came
            self._done = True
            return
        self._start(out)
        usage = chat_usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str) and text:
            self._open_item(out)
            self._text.append(text)
            self._emit(
                out,
                "response.output_text.delta",
                item_id=self.item_id,
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]

    def _finish_stream(self, out: list[bytes]) -> None:
        self._open_item(out)
        text = "".join(self._text)
        status, incomplete = finish_status(self._finish)
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        self._emit(out, "response.output_text.done", **where, text=text, logprobs=[])
        item = message_item(self.item_id, text, status)
        self._emit(out, "response.content_part.done", **where, part=item["content"][0])
        self._emit(out, "response.output_item.done", output_index=0, item=item)
        terminal = "response.completed" if status == "completed" else "response.incomplete"
        self._emit(out, terminal, response=self._response(status, [item], incomplete))
        self._done = True
