"""Holding a request for a serverless model while a controller starts an instance of it (a cold start).

A model with no live replica answers 404 (unknown) or 503 (known, none healthy) at once, unless a fleet controller
is in the mesh: then the ingress asks one over /otela/demand/1 (scheduler/serverless.py). If it is a serverless
model there, the request waits, in a queue bounded by `cold_start_queue`, until a replica serves it or
`cold_start_timeout` runs out (503 `cold_start_failed` with Retry-After); the want is repeated every
REASK_EVERY_S so that a start that failed on one node is retried on another. Unknown to every controller: the
original error. The wait polls the local registry replica, which the new replica's SERVING record reaches by gossip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from opentela.errors import ColdStartError, OpenTelaError
from opentela.fabric.messages import read_msg, write_msg
from opentela.gateway._config import GatewayConfig
from opentela.gateway.mesh import Mesh

logger = logging.getLogger(__name__)

SCALE_OUT_EVERY_S = 10.0
"""At most one request for another instance of a model per this many seconds."""
POLL_S = 0.05
REASK_EVERY_S = 5.0
ASK_TIMEOUT_S = 10.0


class ColdStartHold:
    """Holds requests for models being started on demand (see the module's docstring)."""

    def __init__(self, mesh: Mesh, config: GatewayConfig) -> None:
        self.mesh, self.config = mesh, config
        self.held = 0
        self.cold_starts: dict[str, float] = {}
        """Seconds the last held request of each model waited for its replica."""
        self._scaled_out: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<ColdStartHold held={self.held}>"

    def may_hold(self) -> bool:
        """Whether a request with no replica could be held at all (holding is on and a controller is there)."""
        return self.config.cold_start_timeout > 0 and bool(self.mesh.controllers())

    async def wait(self, model: str, original: OpenTelaError) -> None:
        """Return once a replica of `model` is a candidate; raise `original` if no controller knows the model,
        ColdStartError when it cannot start in time or the queue is full."""
        if self.held >= self.config.cold_start_queue:
            raise ColdStartError(
                f"{self.held} requests already wait for cold starts; try again shortly", retry_after=5.0
            )
        self.held += 1
        started = time.monotonic()
        deadline = started + self.config.cold_start_timeout
        try:
            answer = await self._ask({"op": "want", "model": model})
            if answer is None or answer.get("code") == "unknown_model":
                raise original
            if not answer.get("ok"):
                raise ColdStartError(
                    f"cannot start {model} now: {answer.get('error', answer.get('code'))}", retry_after=10.0
                )
            asked = time.monotonic()
            while not self.mesh.candidates(model):
                now = time.monotonic()
                if now >= deadline:
                    raise ColdStartError(
                        f"{model} did not start within {self.config.cold_start_timeout:g} s",
                        retry_after=10.0,
                    )
                if now - asked >= REASK_EVERY_S:
                    asked = now
                    again = await self._ask({"op": "want", "model": model})
                    if again is not None and not again.get("ok") and again.get("code") != "unknown_model":
                        logger.warning("cold start of %s: %s", model, again.get("error"))
                await asyncio.sleep(POLL_S)
            self.cold_starts[model] = time.monotonic() - started
            logger.info("held request released", extra={"model": model, "waited_s": self.cold_starts[model]})
        finally:
            self.held -= 1

    def scale_out(self, model: str) -> None:
        """Ask a controller, in the background, for one more instance of `model` (its replicas are full)."""
        now = time.monotonic()
        if (
            now - self._scaled_out.get(model, -SCALE_OUT_EVERY_S) < SCALE_OUT_EVERY_S
            or not self.mesh.controllers()
        ):
            return
        self._scaled_out[model] = now

        async def ask() -> None:
            answer = await self._ask({"op": "want", "model": model, "more": True})
            logger.info("asked for another instance", extra={"model": model, "answer": str(answer)[:200]})

        task = asyncio.get_running_loop().create_task(ask())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def catalog_state(self) -> dict[str, Any]:
        """The serverless models of a controller's catalog and their state (cold, starting, warm; replicas; last
        cold start); empty when no controller answers."""
        answer = await self._ask({"op": "state"})
        models = answer.get("models") if answer else None
        return models if isinstance(models, dict) else {}

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The first controller's answer to `message` over /otela/demand/1, or None if none answers."""
        for controller in self.mesh.controllers():
            try:
                stream = await self.mesh.open_demand_stream(controller.peer_id, ASK_TIMEOUT_S)
                try:
                    await write_msg(stream, message)
                    await stream.write_eof()
                    answer = await asyncio.wait_for(read_msg(stream), ASK_TIMEOUT_S)
                finally:
                    with contextlib.suppress(OpenTelaError):
                        await stream.aclose()
            except (OpenTelaError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                logger.info("controller %s did not answer a want: %s", controller.peer_id[-8:], exc)
                continue
            if isinstance(answer, dict):
                return answer
        return None
