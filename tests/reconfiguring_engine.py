"""A stand-in tensor-parallel engine for tests: an OpenAI-shaped server whose replica state can be flipped.

It does no inference. Run it as `python reconfiguring_engine.py --port N [--model M] [--ranks 0,1]`:
- GET /v1/models lists the model with the `otela` object a tensor-parallel engine advertises (`replica_state`,
  `tp_degree`, `tp_ranks`);
- POST /state with {"replica_state": "reconfiguring" | "serving", "tp_ranks": "0,2"} changes it, as losing a
  rank and recovering would;
- POST /v1/chat/completions answers a fixed reply, or with `"stream": true` `max_tokens` chunks 50 ms apart. While
  the replica reconfigures, new requests wait and open streams pause; both go on once it serves again, as a real
  engine's would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

SERVING, RECONFIGURING = "serving", "reconfiguring"
MODEL = "tp-standin"


def standin_argv(port: int, model: str = MODEL, ranks: str = "0,1,2") -> list[str]:
    """The command that runs this stand-in engine on `port` (what a node is started with after `--`)."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--port",
        str(port),
        "--model",
        model,
        "--ranks",
        ranks,
    ]


async def flip(port: int, state: str, ranks: str | None = None) -> dict[str, Any]:
    """Tell the stand-in engine on `port` to reconfigure or to serve again, with these healthy ranks."""
    body: dict[str, Any] = {"replica_state": state, **({"tp_ranks": ranks} if ranks is not None else {})}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}/state", json=body) as resp,
    ):
        resp.raise_for_status()
        result: dict[str, Any] = await resp.json()
        return result


class StandInEngine:
    """The state a tensor-parallel engine advertises, and requests that wait while it reconfigures."""

    def __init__(self, model: str, ranks: str) -> None:
        self.model = model
        self.state = SERVING
        self.ranks = ranks
        self.serving = asyncio.Event()
        self.serving.set()

    def otela(self) -> dict[str, object]:
        ranks = [r for r in self.ranks.split(",") if r]
        return {"replica_state": self.state, "tp_degree": len(ranks), "tp_ranks": self.ranks}

    async def models(self, request: web.Request) -> web.Response:
        entry = {"id": self.model, "object": "model", "owned_by": "stand-in", "otela": self.otela()}
        return web.json_response({"object": "list", "data": [entry]})

    async def set_state(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.state = str(body.get("replica_state", self.state))
        self.ranks = str(body.get("tp_ranks", self.ranks))
        if self.state == RECONFIGURING:
            self.serving.clear()
        else:
            self.serving.set()
        return web.json_response(self.otela())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await self.serving.wait()
        created = int(time.time())
        if not body.get("stream"):
            reply = {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": created,
                "model": self.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            return web.json_response(reply)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(int(body.get("max_tokens") or 4)):
            await self.serving.wait()
            chunk = {
                "id": "chatcmpl-standin",
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.05)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--ranks", default="0,1,2")
    args = parser.parse_args()
    engine = StandInEngine(args.model, args.ranks)
    app = web.Application()
    app.router.add_get("/v1/models", engine.models)
    app.router.add_post("/state", engine.set_state)
    app.router.add_post("/v1/chat/completions", engine.chat)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
