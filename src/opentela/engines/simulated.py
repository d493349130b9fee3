"""The simulated engine: an OpenAI-compatible server faking tokens on a timing model, with fault injection.

It stands in for real inference in tests and overhead benchmarks. It never pretends to be a real model:
/v1/models reports ``owned_by: "otela-simulator"`` and the generated text is filler. One engine may host several
models; with token scheduling they share one executor (`sim_scheduler`), as LLM-Mesh's instances share a node.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
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
from opentela.engines.base import (
    Engine,
    EngineSpec,
    free_port,
    prepare_socket_path,
    runs_otela_engine,
)
from opentela.engines.headroom import RequestState, Slo
from opentela.engines.profile import PerformanceProfile
from opentela.engines.sim_generation import OWNER, FixedPace, Generation, Pace
from opentela.engines.sim_scheduler import Ticket, TokenScheduler
from opentela.engines.sim_timing import sleep_until
from opentela.engines.simulated_config import (
    ERROR_KINDS,
    SimulatedConfig,
)
from opentela.errors import ConfigError
from opentela.openai_edge import CHAT_TOKENS_PER_MESSAGE, estimate_text_tokens

CRASH_EXIT_CODE = 3
"""Exit status of a simulated crash (``crash_after``), distinct from a clean stop."""


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

    def __init__(
        self,
        config: SimulatedConfig,
        crash: Callable[[web.BaseRequest], None],
        scheduler: TokenScheduler | None = None,
    ) -> None:
        self.config = config
        self.model_ids = config.models()
        self.requests = 0
        self.active = 0
        self.model_requests = dict.fromkeys(self.model_ids, 0)
        self.model_active = dict.fromkeys(self.model_ids, 0)
        self._crash = crash
        # Each hosted model is its own instance with its own batch, as separate engines on one node would be.
        self._slots = {m: asyncio.Semaphore(config.max_concurrency) for m in self.model_ids}
        self._rng = random.Random(config.seed)
        self._hung = False
        self._released = asyncio.Event()
        self._ids = itertools.count(1)
        self._created = int(time.time())
        self.timings = {m: config.timing(m) for m in self.model_ids}
        self.timing = self.timings[self.model_ids[0]]
        self.scheduler = scheduler
        self._slos = config.slos()
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

    def crash(self, request: web.BaseRequest) -> None:
        """Crash the engine now (a simulated fault)."""
        self._crash(request)

    async def hang(self, request: web.BaseRequest) -> web.Response:
        """Answer nothing until the server is released, then drop the connection."""
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
            return await self.hang(request)
        data = []
        for model in self.model_ids:
            entry = {"id": model, "object": "model", "created": self._created, "owned_by": OWNER}
            entry["max_model_len"] = self.config.context_length
            entry["otela"] = self.config.advertised_settings(model)
            data.append(entry)
        return web.json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        """GET /health."""
        if self._hung:
            return await self.hang(request)
        body: dict[str, Any] = {"status": "ok", "active": self.active, "requests": self.requests}
        if len(self.model_ids) > 1:
            body["token_scheduling"] = self.scheduler is not None
            scheduled = self.scheduler.stats() if self.scheduler is not None else {}
            body["models"] = {
                m: {
                    "active": self.model_active[m],
                    "requests": self.model_requests[m],
                    **scheduled.get(m, {}),
                }
                for m in self.model_ids
            }
        return web.json_response(body)

    async def _parse(self, request: web.Request) -> tuple[dict[str, Any], str]:
        """The JSON body and the model it names: one hosted here (none means the first hosted)."""
        try:
            body = await request.json(loads=json.loads)
        except ValueError:
            raise _invalid("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _invalid("request body must be a JSON object")
        model = body.get("model", self.model_ids[0])
        if model not in self.model_ids:
            msg = f"model {model!r} is not served here"
            raise _BadRequest(_error(404, msg, "invalid_request_error", "model_not_found"))
        return body, model

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
            return await self.hang(request)
        try:
            body, model = await self._parse(request)
            prompt_tokens = _prompt_tokens(body, chat)
            max_tokens = _max_tokens(body, self.config.default_max_tokens)
        except _BadRequest as bad:
            return bad.response
        fate = self._fate()
        if fate == "hang":
            return await self.hang(request)
        if fate == "disconnect":
            return self._disconnect(request)
        if fate in ERROR_KINDS:
            return _simulated_failure(fate)
        self.model_requests[model] += 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        slots = self._slots[model]
        queued = slots.locked()
        async with slots:
            # Time starts at arrival unless the request waited for a slot; parsing cost hides inside the TTFT.
            start = time.monotonic() if queued else arrival
            self.active += 1
            self.model_active[model] += 1
            ticket: Ticket | None = None
            try:
                pace: Pace
                if self.scheduler is not None:
                    slo = self._slos.get(model) or Slo.llm_mesh(prompt_tokens)
                    state = RequestState(start, slo, prompt_tokens)
                    pace = ticket = self.scheduler.submit(model, state, max_tokens)
                else:
                    pace = self._fixed_pace(model, start, prompt_tokens)
                gen = Generation(
                    self,
                    request,
                    model=model,
                    chat=chat,
                    n_tokens=max_tokens,
                    usage=usage,
                    pace=pace,
                    crash=fate == "crash",
                    first_word=_words_continued(body, chat),
                    crash_events=self.config.crash_events,
                )
                if body.get("stream"):
                    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    return await gen.stream(include_usage)
                return await gen.complete()
            finally:
                # A client that went away cancels this handler: its request stops taking iterations at once.
                if ticket is not None and self.scheduler is not None:
                    self.scheduler.remove(ticket)
                self.active -= 1
                self.model_active[model] -= 1

    def _fixed_pace(self, model: str, start: float, prompt_tokens: int) -> FixedPace:
        """The engine's own timing: TTFT of the prompt, then the ITL with this model's requests decoding."""
        timing = self.timings[model]
        return FixedPace(start, timing.ttft(prompt_tokens), lambda: timing.itl(self.model_active[model]))

    async def embeddings(self, request: web.Request) -> web.Response:
        """POST /v1/embeddings."""
        arrival = time.monotonic()
        if self._hung:
            return await self.hang(request)
        try:
            body, model = await self._parse(request)
        except _BadRequest as bad:
            return bad.response
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            return _invalid("input must be a string or a non-empty list").response
        fate = self._fate()
        if fate == "hang":
            return await self.hang(request)
        if fate == "disconnect":
            return self._disconnect(request)
        if fate in ERROR_KINDS:
            return _simulated_failure(fate)
        self.model_requests[model] += 1
        texts = [x if isinstance(x, str) else " ".join(map(str, x)) for x in inputs]
        # Embeddings stay on the engine's own timing: they are no iterations of the token scheduler.
        async with self._slots[model]:
            await sleep_until(arrival + self.timings[model].ttft(sum(estimate_text_tokens(t) for t in texts)))
        if fate == "crash":
            self._crash(request)
            return await self.hang(request)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vec: Any = embedding_vector(text, self.config.embedding_dim, model)
            if as_base64:
                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        tokens = sum(estimate_text_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})

    def next_id(self, prefix: str) -> str:
        """A response id unique within this server."""
        return f"{prefix}-sim{os.getpid():x}{next(self._ids):x}"


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
        self.scheduler: TokenScheduler | None = None
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
        """Bind and start serving (with token scheduling, read the profiles and start the executor first)."""
        if self.config.scheduled():
            paths = self.config.profile_paths()
            profiles = {
                m: PerformanceProfile.load(paths[m]) if m in paths else self.config.timing(m).as_profile(m)
                for m in self.config.models()
            }
            self.scheduler = TokenScheduler(profiles)
            await self.scheduler.start()
        self.handlers = SimulatedHandlers(self.config, self._crash, self.scheduler)
        app = self.handlers.app()
        app.middlewares.append(self._dead)
        # No access log and handler cancellation on disconnect: a real engine frees the slot of a
        # request whose client went away, and logging every request would distort overhead numbers.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        try:
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.host, self.config.port)
            await site.start()
            if self.config.uds:
                await self._serve_socket(self.config.uds)
        except BaseException:
            await self.aclose()  # a port in use must not leave the executor's loop running
            raise
        self.port = int(self._runner.addresses[0][1])

    async def _serve_socket(self, path: str) -> None:
        # Alongside TCP, not instead: health checks and direct clients keep the port. A socket that cannot be
        # made costs the node its cheaper hop, not the engine its life: the node falls back to TCP.
        assert self._runner is not None
        if prepare_socket_path(path) is None:
            return
        try:
            await web.UnixSite(self._runner, path).start()
        except OSError as exc:
            sys.stderr.write(f"not serving on Unix socket {path}: {exc}; TCP only\n")

    async def aclose(self) -> None:
        """Stop serving; hung requests are dropped."""
        if self.handlers is not None:
            self.handlers.release()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
            if self.config.uds:
                with contextlib.suppress(OSError):
                    os.unlink(self.config.uds)
        # After the runner: requests still streaming at shutdown finish or are cancelled by it, not failed here.
        if self.scheduler is not None:
            await self.scheduler.aclose()  # kept, so its books stay readable after the server stops

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
            models = config.models()
            what = f"model {models[0]}" if len(models) == 1 else f"models {', '.join(models)}"
            if config.scheduled():
                what += ", token scheduling"
            print(f"listening on {server.base_url} (SIMULATED engine, {what})", flush=True)
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
    uds_flag = "--uds"

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``otela engine simulated`` and ``python -m opentela engine simulated``."""
        return runs_otela_engine(argv, "simulated")

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
        return self.spec(self._with_socket(argv, port), port)
