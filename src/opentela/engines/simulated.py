"""The simulated engine: an OpenAI-compatible server faking tokens on a timing model, with fault injection.

It stands in for real inference in tests and overhead benchmarks. It never pretends to be a real model:
/v1/models reports ``owned_by: "otela-simulator"`` and the generated text is filler.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import itertools
import json
import math
import os
import random
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from opentela._signals import on_stop_signals
from opentela.engines._registry import register_engine
from opentela.engines.base import Engine, EngineSpec, free_port, module_index, program_index
from opentela.engines.simulated_config import (
    ERROR_KINDS,
    SimulatedConfig,
)
from opentela.errors import ConfigError
from opentela.openai_edge import CHAT_TOKENS_PER_MESSAGE, estimate_text_tokens

OWNER = "otela-simulator"
CRASH_EXIT_CODE = 3
"""Exit status of a simulated crash (``crash_after``), distinct from a clean stop."""
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")


def embedding_vector(text: str, dim: int, model: str) -> list[float]:
    """A deterministic unit vector for `text`: equal texts embed equally, different ones almost never."""
    raw = b""
    for block in itertools.count():
        if len(raw) >= 4 * dim:
            break
        raw += hashlib.blake2b(f"{model}\0{block}\0{text}".encode(), digest_size=64).digest()
    ints = struct.unpack(f"<{dim}I", raw[: 4 * dim])
    vec = [i / 2**31 - 1.0 for i in ints]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _error(status: int, message: str, error_type: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


class _BadRequest(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


def _invalid(message: str) -> _BadRequest:
    return _BadRequest(_error(400, message, "invalid_request_error", "invalid_request"))


def _simulated_failure(kind: str = "500") -> web.Response:
    if kind == "429":
        return _error(429, "simulated engine overload", "rate_limit_error", "simulated_overload")
    return _error(int(kind), f"simulated engine failure ({kind})", "server_error", "simulated_error")


def _max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid("max_tokens must be a non-negative integer")
    return value


def _content_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # multi-part content: count the text parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _continued(body: dict[str, Any], messages: list[Any]) -> bool:
    """Whether a chat continues its final assistant message (vLLM's fields), checked as vLLM checks them."""
    cont, gen = body.get("continue_final_message", False), body.get("add_generation_prompt", True)
    if not isinstance(cont, bool) or not isinstance(gen, bool):
        raise _invalid("continue_final_message and add_generation_prompt must be booleans")
    if not cont:
        return False
    if gen:
        raise _invalid("continue_final_message and add_generation_prompt cannot both be true")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise _invalid("continue_final_message needs a final assistant message")
    return True


def _words_continued(body: dict[str, Any], chat: bool) -> int:
    """Filler words already written when a chat continues its final message: the text goes on from there."""
    if not chat or body.get("continue_final_message") is not True:
        return 0
    return len(_content_text(body["messages"][-1]).split())


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """The prompt's token count, as the timing model and usage see it."""
    if not chat:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            # A list of token ids counts four characters per id so the estimate maps back to one token each.
            prompt = " ".join(str(p) if isinstance(p, str) else "xxxx" for p in prompt)
        return estimate_text_tokens(str(prompt))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages must be a non-empty list")
    if not _continued(body, messages):
        text = "\n".join(_content_text(m) for m in messages)
        return estimate_text_tokens(text) + CHAT_TOKENS_PER_MESSAGE * len(messages)
    # A continued message is filler this simulator wrote: one token a word, as when it was generated, in place
    # of the generation prompt. A continuation's prompt is then the original's plus the delivered tokens.
    text = "\n".join(_content_text(m) for m in messages[:-1])
    earlier = estimate_text_tokens(text) + CHAT_TOKENS_PER_MESSAGE * (len(messages) - 1)
    return earlier + len(_content_text(messages[-1]).split())


class SimulatedHandlers:
    """The request handlers and timing state of one simulated engine (one per server)."""

    def __init__(self, config: SimulatedConfig, crash: Callable[[web.BaseRequest], None]) -> None:
        self.config = config
        self.requests = 0
        self.active = 0
        self._crash = crash
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._rng = random.Random(config.seed)
        self._hung = False
        self._released = asyncio.Event()
        self._ids = itertools.count(1)
        self._created = int(time.time())
        self.timing = config.timing()
        self.bytes_streamed = 0
        self._error_rates = sorted(config.error_rates().items())

    def app(self) -> web.Application:
        """The aiohttp application with the OpenAI routes."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    def release(self) -> None:
        """Let hung requests finish (by dropping their connections) so the server can shut down."""
        self._released.set()

    async def _hang(self, request: web.BaseRequest) -> web.Response:
        await self._released.wait()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=503)

    @staticmethod
    def _disconnect(request: web.BaseRequest) -> web.Response:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)  # never reaches anyone: the connection is gone

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models."""
        if self._hung:
            return await self._hang(request)
        entry = {"id": self.config.model, "object": "model", "created": self._created, "owned_by": OWNER}
        entry["max_model_len"] = self.config.context_length
        entry["otela"] = self.config.advertised_settings()
        return web.json_response({"object": "list", "data": [entry]})

    async def health(self, request: web.Request) -> web.Response:
        """GET /health."""
        if self._hung:
            return await self._hang(request)
        return web.json_response({"status": "ok", "active": self.active, "requests": self.requests})

    async def _parse(self, request: web.Request) -> dict[str, Any]:
        """The JSON body, checked to name this engine's model (or none)."""
        try:
            body = await request.json(loads=json.loads)
        except ValueError:
            raise _invalid("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _invalid("request body must be a JSON object")
        model = body.get("model", self.config.model)
        if model != self.config.model:
            msg = f"model {model!r} is not served here"
            raise _BadRequest(_error(404, msg, "invalid_request_error", "model_not_found"))
        return body

    def _fate(self) -> str:
        """Count a valid request and draw its fate: ok, error, crash or hang."""
        self.requests += 1
        cfg = self.config
        if cfg.log_line and cfg.log_line_after is not None and self.requests == cfg.log_line_after + 1:
            print(cfg.log_line, file=sys.stderr, flush=True)
        if cfg.hang_after is not None and self.requests > cfg.hang_after:
            self._hung = True
            return "hang"
        if cfg.crash_after is not None and self.requests > cfg.crash_after:
            return "crash"
        if self._error_rates:
            draw = self._rng.random()
            for kind, rate in self._error_rates:
                if draw < rate:
                    return kind
                draw -= rate
        return "ok"

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions."""
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        # time.monotonic, not loop.time: uvloop's clock only advances in whole milliseconds.
        arrival = time.monotonic()
        if self._hung:
            return await self._hang(request)
        try:
            body = await self._parse(request)
            prompt_tokens = _prompt_tokens(body, chat)
            max_tokens = _max_tokens(body, self.config.default_max_tokens)
        except _BadRequest as bad:
            return bad.response
        fate = self._fate()
        if fate == "hang":
            return await self._hang(request)
        if fate == "disconnect":
            return self._disconnect(request)
        if fate in ERROR_KINDS:
            return _simulated_failure(fate)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        queued = self._slots.locked()
        async with self._slots:
            # Time starts at arrival unless the request waited for a slot; parsing cost hides inside the TTFT.
            start = time.monotonic() if queued else arrival
            self.active += 1
            try:
                stream = bool(body.get("stream"))
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                gen = _Generation(self, request, chat, max_tokens, usage, start, fate == "crash")
                gen.first_word = _words_continued(body, chat)
                if stream:
                    return await gen.stream(include_usage)
                return await gen.complete()
            finally:
                self.active -= 1

    async def embeddings(self, request: web.Request) -> web.Response:
        """POST /v1/embeddings."""
        arrival = time.monotonic()
        if self._hung:
            return await self._hang(request)
        try:
            body = await self._parse(request)
        except _BadRequest as bad:
            return bad.response
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            return _invalid("input must be a string or a non-empty list").response
        fate = self._fate()
        if fate == "hang":
            return await self._hang(request)
        if fate == "disconnect":
            return self._disconnect(request)
        if fate in ERROR_KINDS:
            return _simulated_failure(fate)
        texts = [x if isinstance(x, str) else " ".join(map(str, x)) for x in inputs]
        async with self._slots:
            await _sleep_until(arrival + self.timing.ttft(sum(estimate_text_tokens(t) for t in texts)))
        if fate == "crash":
            self._crash(request)
            return await self._hang(request)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vec: Any = embedding_vector(text, self.config.embedding_dim, self.config.model)
            if as_base64:
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        tokens = sum(estimate_text_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": data, "model": self.config.model, "usage": usage})

    def next_id(self, prefix: str) -> str:
        """A response id unique within this server."""
        return f"{prefix}-sim{os.getpid():x}{next(self._ids):x}"


async def _sleep_until(deadline: float) -> None:
    """Sleep until a `time.monotonic()` deadline (not loop.time: uvloop's clock moves in whole ms).

    Absolute deadlines keep a stream from drifting. Under uvloop the wake-up lands ~0.1-0.2 ms late
    here; a helper thread waking the loop was measured and did no better end to end.
    """
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class _Generation:
    """One request's fake decode: token k is due at start + ttft + k * itl (absolute, so no drift)."""

    def __init__(
        self,
        handlers: SimulatedHandlers,
        request: web.Request,
        chat: bool,
        n_tokens: int,
        usage: dict[str, int],
        start: float,
        crash: bool,
    ) -> None:
        self.handlers = handlers
        self.request = request
        self.chat = chat
        self.n_tokens = n_tokens
        self.usage = usage
        self.start = start
        self.crash = crash
        self.ttft = handlers.timing.ttft(usage["prompt_tokens"])
        self.id = handlers.next_id("chatcmpl" if chat else "cmpl")
        self.first_word = 0
        self.created = int(time.time())

    def _itl(self) -> float:
        return self.handlers.timing.itl(self.handlers.active)

    def _crash_now(self) -> None:
        self.handlers._crash(self.request)

    async def complete(self) -> web.Response:
        """Wait out the whole decode, then answer in one JSON body."""
        due = self.start + self.ttft
        await _sleep_until(due)
        if self.crash:
            self._crash_now()
            return await self.handlers._hang(self.request)
        for _ in range(1, self.n_tokens):
            due += self._itl()
            await _sleep_until(due)
        text = "".join(_token(self.first_word + k) for k in range(self.n_tokens))
        model = self.handlers.config.model
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice.update(logprobs=None, finish_reason="length")
        body = {"id": self.id, "object": obj, "created": self.created, "model": model, "choices": [choice]}
        body.update(usage=self.usage, system_fingerprint=OWNER)
        return web.Response(text=json.dumps(body, separators=(",", ":")), content_type="application/json")

    def _chunk(self, k: int | None, include_usage: bool) -> bytes:
        model = self.handlers.config.model
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
        chunk: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": model}
        chunk["choices"] = [choice]
        if include_usage:
            chunk["usage"] = None
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def stream(self, include_usage: bool) -> web.StreamResponse:
        """Send one SSE chunk per token on the timing model, a final chunk, usage if asked, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(self.request)
        due = self.start + self.ttft
        if self.crash and not self.n_tokens:
            await _sleep_until(due)
            self._crash_now()
            return await self.handlers._hang(self.request)
        for k in range(self.n_tokens):
            await _sleep_until(due)
            chunk = self._chunk(k, include_usage)
            self.handlers.bytes_streamed += len(chunk)
            await resp.write(chunk)
            if self.crash:
                self._crash_now()
                return await self.handlers._hang(self.request)
            due += self._itl()
        await resp.write(self._chunk(None, include_usage))
        if include_usage:
            tail: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created,
                "model": self.handlers.config.model,
                "choices": [],
                "usage": self.usage,
            }
            await resp.write(b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _token(k: int) -> str:
    return _WORDS[k % len(_WORDS)] + " "


class SimulatedServer:
    """A simulated engine serving in this event loop: ``async with SimulatedServer(cfg) as srv: ...``.

    In process, a simulated crash drops the connection and every later one instead of exiting, so a
    test can survive it; `run_simulated` (a separate process) exits hard instead.
    """

    def __init__(
        self, config: SimulatedConfig, *, crash: Callable[[web.BaseRequest], None] | None = None
    ) -> None:
        self.config = config
        self._crash_hook = crash
        self.crashed = False
        self.handlers: SimulatedHandlers | None = None
        self._runner: web.AppRunner | None = None
        self.port = config.port

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        return f"http://{self.config.host}:{self.port}"

    def _crash(self, request: web.BaseRequest) -> None:
        if self._crash_hook is not None:
            self._crash_hook(request)
        self.crashed = True
        if request.transport is not None:
            request.transport.abort()

    @web.middleware
    async def _dead(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.crashed:
            # A crashed engine answers nothing: drop the connection as a dead process would.
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        return await handler(request)

    async def start(self) -> None:
        """Bind and start serving."""
        self.handlers = SimulatedHandlers(self.config, self._crash)
        app = self.handlers.app()
        app.middlewares.append(self._dead)
        # No access log and handler cancellation on disconnect: a real engine frees the slot of a
        # request whose client went away, and logging every request would distort overhead numbers.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def aclose(self) -> None:
        """Stop serving; hung requests are dropped."""
        if self.handlers is not None:
            self.handlers.release()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> SimulatedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<SimulatedServer {self.config.model} {self.base_url}>"


def _hard_exit(request: web.BaseRequest) -> None:
    sys.stderr.write(f"simulated crash: exiting hard during {request.method} {request.path}\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


async def serve_simulated(config: SimulatedConfig) -> None:
    """Serve until SIGINT or SIGTERM; a simulated crash ends the process at once."""
    stop = asyncio.Event()
    restore_signals = on_stop_signals(stop.set)
    try:
        async with SimulatedServer(config, crash=_hard_exit) as server:
            print(f"listening on {server.base_url} (SIMULATED engine, model {config.model})", flush=True)
            await stop.wait()
    finally:
        restore_signals()


def run_simulated(config: SimulatedConfig) -> None:
    """Run a simulated engine in this process until SIGINT or SIGTERM (uses uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve_simulated(config))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve_simulated(config))


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: parse ``otela engine simulated`` flags and serve."""
    run_simulated(SimulatedConfig.from_argv(sys.argv[1:] if argv is None else argv))


@register_engine()
class SimulatedEngine(Engine):
    """The simulated engine, run as ``python -m opentela engine simulated``."""

    name = "simulated"
    default_port = None
    ready_timeout = 30.0

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``otela engine simulated`` and ``python -m opentela engine simulated``."""
        i = module_index(argv, ("opentela",))
        if i is None:
            i = program_index(argv, ("otela",))
        return i is not None and list(argv[i + 1 : i + 3]) == ["engine", "simulated"]

    def build(
        self,
        model: str | None = None,
        port: int | None = None,
        *,
        python: str = sys.executable,
        **options: Any,
    ) -> EngineSpec:
        """The command for a simulated engine; options are `SimulatedConfig` fields (ttft_ms, ...)."""
        names = {f.name for f in dataclasses.fields(SimulatedConfig)} - {"port", "model"}
        unknown = set(options) - names
        if unknown:
            raise ConfigError(
                f"unknown options for the simulated engine: {', '.join(sorted(unknown))}; known: "
                + ", ".join(sorted(names))
            )
        port = port or free_port()
        config = SimulatedConfig(model=model or SimulatedConfig.model, port=port, **options)
        argv = [python, "-m", "opentela", "engine", "simulated", *config.to_argv()]
        return self.spec(argv, port)
