"""The tensor-parallel engine's OpenAI server: one `TensorParallelReplica` behind chat and completions.

Requests are tokenized, embedded and sampled here (engines/openai_text.py); their steps are batched: whatever steps
are waiting when the replica finishes one batch run together as the next (each request's rows still computed on
their own, so batching never changes a token). The replica runs in one worker thread, so the event loop keeps
streaming while the ranks compute, and while they reconfigure after a loss: open streams pause and go on, new
requests wait. ``/v1/models`` reports the replica's degree, healthy ranks and state (``serving`` or
``reconfiguring``) in its ``otela`` object, which the node copies into its record.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from aiohttp import web

from opentela import openai_edge as edge
from opentela._signals import on_stop_signals
from opentela.engines.openai_text import (
    OpenAIShape,
    TextGeneration,
    parse_request,
    stream_answer,
    whole_answer,
)
from opentela.engines.tp.replica import RequestState, TensorParallelReplica
from opentela.errors import EngineUnavailableError, InvalidRequestError, ModelNotFoundError, OpenTelaError
from opentela.model.head import ClientHead
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.model.tensor_parallel import DEFAULT_FFN_SHARDS
from opentela.model.tokenizer import GGUFTokenizer

logger = logging.getLogger(__name__)

SERVED_AS = "tensor-parallel replicas"
DEFAULT_MAX_TOKENS = 256


class ReplicaDriver:
    """Runs the replica's calls in one thread, batching the steps that wait together."""

    def __init__(self, replica: TensorParallelReplica) -> None:
        self.replica = replica
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tp-replica")
        self._pending: list[tuple[RequestState, np.ndarray, asyncio.Future[np.ndarray]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self.failed = asyncio.Event()
        """Set once the replica has lost its last rank: the engine then exits, and its node fails over."""
        self.steps = 0
        self.batched_rows = 0

    async def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` in the replica's thread, after the calls before it."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def start(self) -> None:
        """Start batching steps, and watching for ranks that die between steps."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="tp-steps")
        self._watch = loop.create_task(self._watch_ranks(), name="tp-watch")

    async def _watch_ranks(self, interval: float = 0.5) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.call(self.replica.check)
            except Exception:  # the replica has failed: requests see why; the watch has nothing left to do
                logger.exception("the tensor-parallel replica failed")
            if self.replica.state == "failed":
                self.failed.set()
                return

    async def step(self, req: RequestState, hidden: np.ndarray) -> np.ndarray:
        """One request's step, run with whatever others wait."""
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((req, hidden, fut))
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Requests whose client left meanwhile are dropped here; the replica drops any closed since.
            batch, self._pending = [entry for entry in self._pending if not entry[2].done()], []
            if not batch:
                continue
            try:
                outs = await self.call(self.replica.step, [(req, hidden) for req, hidden, _ in batch])
            except Exception as exc:  # every request in the batch learns why
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self.steps += 1
            self.batched_rows += len(batch)
            for (req, _, fut), out in zip(batch, outs, strict=True):
                if fut.done():
                    continue
                if out is None:
                    fut.set_exception(EngineUnavailableError(f"request {req.id} was closed"))
                else:
                    fut.set_result(out)

    async def aclose(self) -> None:
        """Stop batching and stop the ranks."""
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.call(self.replica.close)
        self._executor.shutdown(wait=True)


class TensorParallelServer:
    """The HTTP side: models, health, chat and completions."""

    def __init__(
        self,
        replica: TensorParallelReplica,
        model_id: str,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.replica, self.model_id, self.max_tokens = replica, model_id, max_tokens
        self.driver = ReplicaDriver(replica)
        self.head = ClientHead(replica.model_path)
        self.tokenizer = GGUFTokenizer(replica.model_path)
        self._ids = itertools.count()

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._errors], client_max_size=8 * 1024**2)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/tp", self.status)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.driver.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.driver.aclose()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        rid = edge.request_id(request.headers.get(edge.REQUEST_ID_HEADER))
        request["request_id"] = rid
        try:
            return await handler(request)
        except OpenTelaError as err:
            status, headers, body = edge.render_error(err, rid)
            return web.Response(
                status=status, headers=headers, body=body, content_type=edge.JSON_CONTENT_TYPE
            )

    def tp_settings(self) -> dict[str, Any]:
        """The ``otela`` object of the model entry: degree, healthy ranks and state."""
        r = self.replica
        ranks = r.healthy_ranks
        return {
            "engine": "tensor-parallel",
            "tp_degree": len(ranks),
            "tp_ranks": ",".join(str(x) for x in ranks),
            "replica_state": "reconfiguring" if r.state == "reconfiguring" else r.state,
        }

    async def models(self, request: web.Request) -> web.Response:
        """The one model, with its context and the replica's state."""
        entry = {
            "id": self.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "opentela",
            "max_model_len": self.replica.config.context_length,
            "otela": self.tp_settings(),
        }
        return web.json_response({"object": "list", "data": [entry]})

    async def health(self, request: web.Request) -> web.Response:
        """200 while the replica serves or reconfigures; 503 once it has no ranks left."""
        status = 503 if self.replica.state == "failed" else 200
        return web.json_response(self.tp_settings(), status=status)

    async def status(self, request: web.Request) -> web.Response:
        """The replica's placement, rank processes and recoveries so far."""
        r = self.replica
        body = {
            **self.tp_settings(),
            "placement": r.placement.describe() if r.placement else "",
            "rank_pids": {str(k): v for k, v in r.rank_pids().items()},
            "open_requests": len(r.requests),
            "steps": self.driver.steps,
            "recoveries": [rep.as_dict() for rep in r.recoveries],
        }
        return web.json_response(body)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Chat or completions, whole or streamed."""
        kind = edge.INFERENCE_PATHS[request.path]
        body = edge.parse_body(await request.read())
        model = body.get("model")
        if model not in (None, "", self.model_id):
            raise ModelNotFoundError(f"this engine serves {self.model_id}, not {model!r}", param="model")
        req = parse_request(kind, body, self.tokenizer, self.replica.config, self.max_tokens, SERVED_AS)
        if self.replica.state == "failed":
            raise EngineUnavailableError("the tensor-parallel replica lost all its ranks")
        rid = f"{request['request_id']}-{next(self._ids)}"
        state = await self.driver.call(self.replica.open, rid, len(req.prompt_ids) + req.max_tokens)
        try:
            gen = TextGeneration(
                self.head, self.tokenizer, req, lambda hidden: self.driver.step(state, hidden)
            )
            shape = OpenAIShape(self.model_id, req.chat)
            headers = {edge.RESPONSE_ID_HEADER: request["request_id"]}
            if not req.stream:
                return web.Response(
                    body=await whole_answer(gen, shape), headers=headers, content_type="application/json"
                )
            headers.update({"Content-Type": edge.SSE_CONTENT_TYPE, "Cache-Control": "no-cache"})
            response = web.StreamResponse(status=200, headers=headers)
            await response.prepare(request)
            try:
                await stream_answer(gen, shape, response.write)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client left; its caches are freed below
            return response
        finally:
            await self.driver.call(self.replica.close_request, rid)


async def serve(args: argparse.Namespace) -> None:
    """Start the ranks, serve until SIGINT or SIGTERM, stop the ranks."""
    path = args.model or default_model_path()
    replica = TensorParallelReplica(
        path,
        args.ranks,
        n_ffn_shards=args.ffn_shards,
        threads=args.threads,
        recovery=args.recovery,
        weights=args.weight_reload,
        step_timeout=args.step_timeout,
    )
    stop = asyncio.Event()
    restore = on_stop_signals(stop.set)
    try:
        await asyncio.get_running_loop().run_in_executor(None, replica.start)
        server = TensorParallelServer(
            replica, args.served_model_name or SMOLLM2_ID, max_tokens=args.max_tokens
        )
        runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        print(
            f"listening on http://{args.host}:{port} (tensor-parallel engine, {args.ranks} ranks, "
            f"model {server.model_id})",
            flush=True,
        )
        stopped = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(server.driver.failed.wait())
        await asyncio.wait([stopped, failed], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        failed.cancel()
        await runner.cleanup()
        if server.driver.failed.is_set():
            raise SystemExit("the tensor-parallel replica lost all its ranks")
    finally:
        restore()
        if replica.state != "failed":
            replica.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``otela engine tp`` flags."""
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    parser.add_argument(
        "--served-model-name", default=None, help=f"model id to answer to (default {SMOLLM2_ID})"
    )
    parser.add_argument("--ranks", type=int, default=3, help="worker processes (TP degree), default 3")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free one)")
    parser.add_argument(
        "--ffn-shards", type=int, default=DEFAULT_FFN_SHARDS, help=f"FFN cuts (default {DEFAULT_FFN_SHARDS})"
    )
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank (default 1)")
    parser.add_argument(
        "--recovery",
        choices=("backup", "recompute"),
        default="backup",
        help="after a rank loss, restore caches from the host backup (default) or re-prefill them",
    )
    parser.add_argument(
        "--weight-reload",
        choices=("on_demand", "reshard"),
        default="on_demand",
        help="after a rank loss, load only the units a survivor lacks (default) or all of its new ones",
    )
    parser.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds before a silent rank counts as lost"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="output cap when a request names none"
    )


def run_from_args(args: argparse.Namespace) -> None:
    """Serve with flags parsed by `add_arguments` (uvloop when installed)."""
    if args.ranks < 1:
        raise InvalidRequestError("--ranks must be at least 1")
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(args))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m opentela.engines.tp.server``: parse flags and serve."""
    parser = argparse.ArgumentParser(prog="otela engine tp")
    add_arguments(parser)
    run_from_args(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
