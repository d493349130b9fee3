"""Serverless models: started on a node with room when a request wants one, stopped by their node after a
keep-alive (LLM-Mesh's sections 4 and 6, as the mesh runs them).

An ingress that holds a request for a serverless model with no live replica asks a controller over
/otela/demand/1 (``{"op": "want", "model": M}``; with ``"more": true`` when its replicas are all full, for one more
instance on another node). The controller answers at once: ``warm`` (a replica serves it),
``starting`` (an instance is on its way, on which node, since when), or an error (``unknown_model``: not a
serverless model of this catalog; ``no_room``: no node has the memory now). To start one it picks a node: CPU
nodes first, then GPU nodes; among them the one the instance fills best (the least room left after it, so
fragments stay free for larger models), counting what the node's record says its engines take and what this
controller has just sent it. The assignment names the instance's memory and keep-alive; the node stops the engine
itself once idle that long, so instances are recycled even while no controller runs.

The instance's memory is LLM-Mesh's Eq. 2 at one request: the weights plus the KV cache of
max(input + average output, L_min) tokens, L_min being the model's longest context unless the catalog says
otherwise. A cold start is timed from the first want to the replica's SERVING record and kept per model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentela._types import Lifecycle, Stream
from opentela.errors import OpenTelaError, ProtocolError
from opentela.fabric.messages import read_msg, write_msg

logger = logging.getLogger(__name__)

Send = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
MAX_DEMAND_MESSAGE = 4096
READ_TIMEOUT_S = 10.0
ASSIGN_TRIES = 3
"""Nodes one want tries before it answers no_room (a node may refuse: another controller was quicker)."""


@dataclass(frozen=True)
class ServerlessModel:
    """A catalog model started on demand: how nodes start it, what it takes, how long it may idle."""

    id: str
    launch: Mapping[str, Any]
    """``command`` (a template) or ``engine`` with ``options``, as for fleet assignments."""
    memory_mib: int
    keep_alive_s: float
    cold_start_timeout_s: float = 300.0
    """How long a start may take before the controller starts another instance elsewhere."""
    profile: str = ""
    """The id of the performance profile its instances run under (sent with the assignment), if known."""


def instance_memory_mib(
    weights_bytes: float, kv_bytes_per_token: float, avg_input: float, avg_output: float, l_min: float
) -> int:
    """Eq. 2 of LLM-Mesh for a fresh instance with one request: weights + C * max(I + O_avg, L_min), in MiB."""
    kv = kv_bytes_per_token * max(avg_input + avg_output, l_min)
    return max(1, math.ceil((weights_bytes + kv) / 2**20))


def engine_memory_mib(record: Any) -> int:
    """The memory a node lends its engines, as its record states it (0: it does not share)."""
    return int(record.hardware.get("engine_memory_mib", 0) or 0)


def room_mib(record: Any) -> int | None:
    """What is free of a node's engine memory, or None when it takes no shared engines (it does not say how
    much it lends, or an engine without a footprint runs on it alone)."""
    total = engine_memory_mib(record)
    if total <= 0 or "worker" not in record.roles:
        return None
    used = 0
    for entry in record.models:
        footprint = entry.settings.get("memory_mib")
        if footprint is None:
            return None
        used += int(footprint)
    return total - used


def choose_node(
    records: Iterable[Any], need_mib: int, reserved: Mapping[str, int], exclude: Sequence[str] = ()
) -> Any | None:
    """The node to start an instance of `need_mib` on: CPU nodes first, then GPU; best fit within each."""
    best: tuple[int, int, str] | None = None
    chosen = None
    for record in records:
        if record.peer_id in exclude or Lifecycle(record.lifecycle) not in (
            Lifecycle.JOIN,
            Lifecycle.SERVING,
        ):
            continue
        room = room_mib(record)
        if room is None:
            continue
        left = room - reserved.get(record.peer_id, 0) - need_mib
        if left < 0:
            continue
        rank = (1 if record.hardware.get("gpus") else 0, left, record.peer_id)
        if best is None or rank < best:
            best, chosen = rank, record
    return chosen


@dataclass
class Starting:
    """An instance on its way: where, since when, for how much memory."""

    peer_id: str
    since: float
    memory_mib: int
    version: int
    """The node's record version when it was assigned (a later 'assignment failed' is about this one)."""


@dataclass
class ServerlessController:
    """Answers wants (see the module's docstring) and times cold starts."""

    models: Mapping[str, ServerlessModel]
    records: Callable[[], list[Any]]
    send: Send
    clock: Callable[[], float] = time.monotonic
    starting: dict[str, Starting] = field(default_factory=dict)
    cold_starts: dict[str, list[float]] = field(default_factory=dict)
    """Seconds from the first want to SERVING, per model, oldest first."""
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<ServerlessController models={len(self.models)} starting={sorted(self.starting)}>"

    def settle(self, records: Sequence[Any] | None = None) -> None:
        """Note instances that now serve (timing their cold start) and forget failed or overdue ones."""
        records = self.records() if records is None else records
        now = self.clock()
        by_peer = {r.peer_id: r for r in records}
        for model, start in list(self.starting.items()):
            record = by_peer.get(start.peer_id)
            if record is not None and any(m.id == model for m in record.models):
                seconds = now - start.since
                self.cold_starts.setdefault(model, []).append(seconds)
                del self.starting[model]
                logger.info(
                    "cold start done", extra={"model": model, "peer_id": start.peer_id, "seconds": seconds}
                )
            elif (
                record is None
                or now - start.since > self.models[model].cold_start_timeout_s
                or (record.version > start.version and str(record.reason).startswith("assignment failed"))
            ):
                del self.starting[model]
                logger.warning(
                    "cold start failed",
                    extra={
                        "model": model,
                        "peer_id": start.peer_id,
                        "reason": getattr(record, "reason", "gone"),
                    },
                )

    async def want(self, model: str, more: bool = False) -> dict[str, Any]:
        """The answer to a want for `model`: start an instance when none serves or starts, or with `more` (its
        replicas are full) one more on a node that does not run it yet."""
        spec = self.models.get(model)
        if spec is None:
            return {
                "ok": False,
                "code": "unknown_model",
                "error": f"{model!r} is not a serverless model here",
            }
        async with self._locks.setdefault(model, asyncio.Lock()):
            records = self.records()
            self.settle(records)
            running = [r.peer_id for r in records if any(m.id == model for m in r.models)]
            start = self.starting.get(model)
            if start is not None:
                return self._starting_answer(model, start)
            if running and not more:
                return {"ok": True, "state": "warm"}
            return await self._start(spec, records, running)

    async def _start(
        self, spec: ServerlessModel, records: Sequence[Any], running: Sequence[str]
    ) -> dict[str, Any]:
        reserved: dict[str, int] = {}
        for s in self.starting.values():
            reserved[s.peer_id] = reserved.get(s.peer_id, 0) + s.memory_mib
        tried: list[str] = list(running)
        last_error = "no node lends engine memory"
        for _ in range(ASSIGN_TRIES):
            node = choose_node(records, spec.memory_mib, reserved, tried)
            if node is None:
                break
            tried.append(node.peer_id)
            message = {
                "op": "assign",
                "model": spec.id,
                **spec.launch,
                "memory_mib": spec.memory_mib,
                "keep_alive_s": spec.keep_alive_s,
                **({"profile": spec.profile} if spec.profile else {}),
            }
            try:
                answer = await self.send(node.peer_id, message)
            except (OpenTelaError, OSError, TimeoutError) as exc:
                answer = {"ok": False, "error": str(exc) or type(exc).__name__}
            if answer.get("ok"):
                start = Starting(node.peer_id, self.clock(), spec.memory_mib, node.version)
                self.starting[spec.id] = start
                logger.info(
                    "cold start",
                    extra={"model": spec.id, "peer_id": node.peer_id, "memory_mib": spec.memory_mib},
                )
                return self._starting_answer(spec.id, start)
            last_error = f"{node.peer_id[-8:]} refused: {answer.get('error', answer.get('code', '?'))}"
        return {
            "ok": False,
            "code": "no_room",
            "error": f"no node has {spec.memory_mib} MiB free for {spec.id} now ({last_error})",
        }

    def _starting_answer(self, model: str, start: Starting) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "ok": True,
            "state": "starting",
            "node": start.peer_id,
            "waited_s": round(self.clock() - start.since, 3),
        }
        if self.cold_starts.get(model):
            answer["last_cold_start_s"] = round(self.cold_starts[model][-1], 3)
        return answer

    async def handle_stream(self, stream: Stream) -> None:
        """Handler of /otela/demand/1: one want, one answer."""
        try:
            message = await asyncio.wait_for(read_msg(stream, MAX_DEMAND_MESSAGE), READ_TIMEOUT_S)
        except (ProtocolError, TimeoutError, asyncio.IncompleteReadError) as exc:
            await _answer(stream, {"ok": False, "code": "bad_request", "error": f"unreadable: {exc}"})
            return
        if isinstance(message, dict) and message.get("op") == "state":
            await _answer(stream, {"ok": True, "models": self.state()})
            return
        if (
            not isinstance(message, dict)
            or message.get("op") != "want"
            or not isinstance(message.get("model"), str)
        ):
            await _answer(
                stream, {"ok": False, "code": "bad_request", "error": "expected {op: want, model: M}"}
            )
            return
        await _answer(stream, await self.want(message["model"], more=bool(message.get("more"))))

    def state(self) -> dict[str, dict[str, Any]]:
        """Per serverless model: cold, starting or warm, its replicas and its last cold start (dashboards)."""
        records = self.records()
        out = {}
        for model in self.models:
            replicas = [r.peer_id for r in records if any(m.id == model for m in r.models)]
            state = "warm" if replicas else ("starting" if model in self.starting else "cold")
            last = self.cold_starts.get(model)
            out[model] = {
                "state": state,
                "replicas": len(replicas),
                "last_cold_start_s": last[-1] if last else None,
            }
        return out


async def _answer(stream: Stream, answer: dict[str, Any]) -> None:
    try:
        await write_msg(stream, answer)
    except OpenTelaError as exc:
        logger.debug("demand answer not delivered: %s", exc)
