"""One request's fake generation in the simulated engine: filler tokens on a pace, as one JSON body or SSE chunks.

The pace says when token k is produced: on the engine's own timing model (`FixedPace`) or when the shared token
scheduler gives the request's instance an iteration (`sim_scheduler.Ticket`). The generation only waits for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from opentela.engines.sim_timing import sleep_until

OWNER = "otela-simulator"
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")


class Pace(Protocol):
    """When a request's tokens are produced."""

    async def token(self, k: int) -> None:
        """Return once token `k` (0-based) has been produced."""
        ...


class GenerationHost(Protocol):
    """What a generation needs from the engine serving it."""

    bytes_streamed: int

    def next_id(self, prefix: str) -> str:
        """A response id unique within the engine."""
        ...

    def crash(self, request: web.BaseRequest) -> None:
        """Crash the engine now (a simulated fault)."""
        ...

    async def hang(self, request: web.BaseRequest) -> web.Response:
        """Answer nothing until the engine is released."""
        ...


class FixedPace:
    """Token k is due at start + ttft + the inter-token latencies before it (absolute, so no drift)."""

    def __init__(self, start: float, ttft: float, itl: Callable[[], float]) -> None:
        self._due = start + ttft
        self._itl = itl
        self._next = 0

    async def token(self, k: int) -> None:
        """Sleep until token `k` is due; the latency to each next token is read when it starts."""
        while self._next < k:
            self._due += self._itl()
            self._next += 1
        await sleep_until(self._due)


def _token(k: int) -> str:
    return _WORDS[k % len(_WORDS)] + " "


class Generation:
    """One request's fake decode on its pace, answered whole or streamed chunk by chunk."""

    def __init__(
        self,
        host: GenerationHost,
        request: web.Request,
        *,
        model: str,
        chat: bool,
        n_tokens: int,
        usage: dict[str, int],
        pace: Pace,
        crash: bool,
        first_word: int = 0,
        crash_events: int = 1,
    ) -> None:
        self.host = host
        self.request = request
        self.model = model
        self.chat = chat
        self.n_tokens = n_tokens
        self.usage = usage
        self.pace = pace
        self.crash = crash
        self.crash_events = crash_events
        """SSE events a crashing stream sends before it dies."""
        self.first_word = first_word
        self.id = host.next_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    async def complete(self) -> web.Response:
        """Wait out the whole decode, then answer in one JSON body."""
        await self.pace.token(0)
        if self.crash:
            self.host.crash(self.request)
            return await self.host.hang(self.request)
        for k in range(1, self.n_tokens):
            await self.pace.token(k)
        text = "".join(_token(self.first_word + k) for k in range(self.n_tokens))
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice.update(logprobs=None, finish_reason="length")
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        body.update(usage=self.usage, system_fingerprint=OWNER)
        return web.Response(text=json.dumps(body, separators=(",", ":")), content_type="application/json")

    def _chunk(self, k: int | None, include_usage: bool) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {} if k is None else {"content": _token(self.first_word + k)}
            if k == 0:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": "" if k is None else _token(self.first_word + k)}
            obj = "text_completion"
        choice.update(logprobs=None, finish_reason="length" if k is None else None)
        chunk: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        chunk["choices"] = [choice]
        if include_usage:
            chunk["usage"] = None
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def stream(self, include_usage: bool) -> web.StreamResponse:
        """Send one SSE chunk per token on the pace, a final chunk, usage if asked, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(self.request)
        if self.crash and (not self.n_tokens or not self.crash_events):
            await self.pace.token(0)
            self.host.crash(self.request)
            return await self.host.hang(self.request)
        for k in range(self.n_tokens):
            await self.pace.token(k)
            chunk = self._chunk(k, include_usage)
            self.host.bytes_streamed += len(chunk)
            await resp.write(chunk)
            if self.crash and k + 1 >= self.crash_events:
                self.host.crash(self.request)
                return await self.host.hang(self.request)
        await resp.write(self._chunk(None, include_usage))
        if include_usage:
            tail: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage,
            }
            await resp.write(b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
