"""Serving side of /otela/control/1: an authorised fleet controller starts and stops the engines of this node.

One request and one answer per stream, as length-prefixed msgpack maps. The request::

    {"op": "assign", "model": "M", "command": "vllm serve {model} --port {port} -tp {tp}",
     "tp": 2, "gpus": [0, 1], "device": "L40S"}

or, instead of ``command``, an engine adapter name and its options (``"engine": "vllm", "options": {...}``).
An assignment that names its footprint (``"memory_mib": N``, optionally the id of the performance profile the
engine runs under, ``"profile": "..."``, and a keep-alive, ``"keep_alive_s": S``, after which an engine that served
nothing is stopped) may join engines already running, as long as the node's engine memory has
room; one without it needs an idle node. The answer is ``{"ok": true, "state": "starting", ...}`` or
``{"ok": false, "code": C, "error": "..."}`` with C one of ``not_authorised``, ``busy``, ``no_room``,
``bad_template``, ``bad_request``.

``{"op": "stop", "model": "M"}`` stops the engine serving M and returns its memory, leaving the node's other
engines alone: ``{"ok": true, "state": "stopped", "model": "M"}``, or ``not_found`` when none serves it.

``{"op": "blocks", "model": "M", "start": A, "end": E}`` makes an idle node a block server for blocks [A, E) of
the split model M (node/block_server.py): ``{"ok": true, "state": "loading", ...}``, then SERVING with the span in
its record; ``busy`` when the node already serves something.

What follows an accepted assignment (SERVING, or back to idle with ``assignment failed: ...`` as the record's
reason) is in the registry record.

Only controllers whose peer ids the node lists in its ``controllers`` setting may assign: an assignment runs
a command on this machine. ``accept_assignments = "any"`` lifts the check, for local demos only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentela._types import PeerId, Stream
from opentela.engines._registry import engine_from_command, engine_from_name
from opentela.engines.base import EngineSpec, as_argv
from opentela.errors import ConfigError, OpenTelaError, ProtocolError
from opentela.fabric.messages import read_msg, write_msg

logger = logging.getLogger(__name__)

MAX_CONTROL_MESSAGE = 64 * 1024
READ_TIMEOUT_S = 10.0
PLACEHOLDERS = ("model", "port", "tp", "gpus", "device")
"""What a command template may contain: ``{model}``, ``{port}``, ``{tp}``, ``{gpus}`` (comma-separated) and
``{device}``; the node fills ``{port}`` with a free port."""
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Refusal(Exception):
    """An assignment this node will not take, with a machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class EngineAssignment:
    """A validated ``assign`` request: what to serve and how to start it."""

    model: str
    spec: EngineSpec
    tp: int
    gpus: tuple[int, ...]
    device: str
    controller: PeerId
    memory_mib: int | None = None
    """The engine's memory footprint; None: it needs the node to itself."""
    profile: str = ""
    """The id of its performance profile (engines/profile.py), published with its model entry."""
    keep_alive_s: float | None = None
    """Stop the engine after it served no request for this long (serverless models); None: keep it."""


def render_template(command: str | Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The argv of a command template with its placeholders filled (``{port}`` is left to the engine adapter).

    Placeholders are replaced inside each argument after splitting, so a value can never add arguments.
    """
    argv = as_argv(command)
    if not argv:
        raise Refusal("bad_template", "the command template is empty")
    for arg in argv:
        for name in _PLACEHOLDER.findall(arg):
            if name not in PLACEHOLDERS:
                raise Refusal(
                    "bad_template",
                    f"unknown placeholder {{{name}}} in the command template; known: "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS),
                )
    out = []
    for arg in argv:
        for name, value in values.items():
            arg = arg.replace(f"{{{name}}}", value)
        out.append(arg)
    return out


def parse_assignment(message: Any, controller: PeerId) -> EngineAssignment:
    """Validate an ``assign`` request and build its engine spec; Refusal says what is wrong."""
    if not isinstance(message, Mapping) or message.get("op") != "assign":
        raise Refusal("bad_request", "expected a map with op = 'assign' or 'stop'")
    model = message.get("model")
    if not isinstance(model, str) or not model or len(model) > 512:
        raise Refusal("bad_request", "'model' must be a non-empty string")
    gpus = message.get("gpus", [])
    tp = message.get("tp", max(len(gpus), 1) if isinstance(gpus, list) else 1)
    if not isinstance(gpus, list) or not all(isinstance(g, int) and g >= 0 for g in gpus):
        raise Refusal("bad_request", "'gpus' must be a list of GPU indices")
    if not isinstance(tp, int) or tp < 1:
        raise Refusal("bad_request", "'tp' must be a positive integer")
    device = str(message.get("device", ""))
    memory = message.get("memory_mib")
    if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0):
        raise Refusal("bad_request", "'memory_mib' must be a positive integer")
    profile = message.get("profile", "")
    if not isinstance(profile, str) or len(profile) > 128:
        raise Refusal("bad_request", "'profile' must be a profile id")
    keep_alive = message.get("keep_alive_s")
    if keep_alive is not None and (
        not isinstance(keep_alive, int | float) or isinstance(keep_alive, bool) or not keep_alive > 0
    ):
        raise Refusal("bad_request", "'keep_alive_s' must be a positive number of seconds")
    values = {"model": model, "tp": str(tp), "gpus": ",".join(map(str, gpus)), "device": device}
    command = message.get("command")
    try:
        if command is not None:
            if not isinstance(command, str | list) or (
                isinstance(command, list) and not all(isinstance(a, str) for a in command)
            ):
                raise Refusal("bad_template", "'command' must be a string or a list of strings")
            spec = engine_from_command(render_template(command, values))
        else:
            engine = message.get("engine")
            options = message.get("options", {})
            if not isinstance(engine, str) or not engine:
                raise Refusal("bad_request", "an assignment needs a 'command' template or an 'engine' name")
            if not isinstance(options, Mapping):
                raise Refusal("bad_request", "'options' must be a map")
            spec = engine_from_name(engine, model, None, **dict(options))
    except (ConfigError, ValueError) as exc:
        raise Refusal("bad_template", str(exc)) from None
    if gpus:
        spec = dataclasses.replace(spec, env={**spec.env, "CUDA_VISIBLE_DEVICES": values["gpus"]})
    return EngineAssignment(
        model,
        spec,
        tp,
        tuple(gpus),
        device,
        controller,
        memory,
        profile,
        None if keep_alive is None else float(keep_alive),
    )


class ControlService:
    """Answers assignments and stops: checks the sender, asks `busy` whether the node can take the assignment
    (None, or a Refusal to raise), hands it to `start`; `stop(model)` stops one engine (False: none serves it)."""

    def __init__(
        self,
        controllers: Sequence[PeerId],
        accept_any: bool,
        busy: Callable[[EngineAssignment], Refusal | None],
        start: Callable[[EngineAssignment], None],
        stop: Callable[[str], bool] | None = None,
        blocks: Callable[[str, int, int], Refusal | None] | None = None,
    ) -> None:
        self.controllers = frozenset(controllers)
        self.accept_any = accept_any
        self._busy, self._start, self._stop = busy, start, stop
        self._blocks = blocks
        self.counters = {"accepted": 0, "refused": 0}

    def __repr__(self) -> str:
        who = "any" if self.accept_any else f"{len(self.controllers)} controllers"
        return f"<ControlService {who} {self.counters}>"

    def authorise(self, sender: PeerId) -> None:
        """Refusal unless `sender` may control this node."""
        if not self.accept_any and sender not in self.controllers:
            why = (
                "this node lists no controllers (set [node] controllers)"
                if not self.controllers
                else "the sender is not in this node's controllers"
            )
            raise Refusal("not_authorised", f"peer {sender} may not assign work here: {why}")

    def check(self, message: Any, sender: PeerId) -> EngineAssignment:
        """The assignment to start, or Refusal: not authorised, busy, no room, or a bad request or template."""
        self.authorise(sender)
        assignment = parse_assignment(message, sender)
        refusal = self._busy(assignment)
        if refusal is not None:
            raise refusal
        return assignment

    def check_stop(self, message: Any, sender: PeerId) -> str:
        """The model a ``stop`` request names, once its sender is authorised."""
        self.authorise(sender)
        model = message.get("model")
        if not isinstance(model, str) or not model:
            raise Refusal("bad_request", "'model' must be a non-empty string")
        if self._stop is None:
            raise Refusal("bad_request", "this node does not stop single engines")
        return model

    async def handle_stream(self, stream: Stream) -> None:
        """One request, one answer."""
        sender = stream.remote_peer
        try:
            message = await asyncio.wait_for(read_msg(stream, MAX_CONTROL_MESSAGE), READ_TIMEOUT_S)
        except (ProtocolError, TimeoutError, asyncio.IncompleteReadError) as exc:
            await self._answer(stream, {"ok": False, "code": "bad_request", "error": f"unreadable: {exc}"})
            return
        if isinstance(message, Mapping) and message.get("op") == "stop":
            await self._handle_stop(stream, message, sender)
            return
        if isinstance(message, Mapping) and message.get("op") == "blocks":
            await self._handle_blocks(stream, message, sender)
            return
        try:
            assignment = self.check(message, sender)
            # No await between the busy check and the start: two assignments cannot both pass.
            self._start(assignment)
        except Refusal as exc:
            self.counters["refused"] += 1
            logger.warning(
                "assignment refused",
                extra={"controller": sender, "code": exc.code, "error": str(exc), "model": _model(message)},
            )
            await self._answer(stream, {"ok": False, "code": exc.code, "error": str(exc)})
            return
        self.counters["accepted"] += 1
        logger.info(
            "assignment accepted",
            extra={
                "controller": sender,
                "model": assignment.model,
                "engine": assignment.spec.name,
                "gpus": ",".join(map(str, assignment.gpus)),
                "command": assignment.spec.command_line,
            },
        )
        await self._answer(
            stream,
            {
                "ok": True,
                "state": "starting",
                "model": assignment.model,
                "engine": assignment.spec.name,
                "port": assignment.spec.port,
            },
        )

    async def _handle_stop(self, stream: Stream, message: Mapping[str, Any], sender: PeerId) -> None:
        try:
            model = self.check_stop(message, sender)
            assert self._stop is not None
            if not self._stop(model):
                raise Refusal("not_found", f"no engine on this node serves {model}")
        except Refusal as exc:
            self.counters["refused"] += 1
            await self._answer(stream, {"ok": False, "code": exc.code, "error": str(exc)})
            return
        self.counters["stopped"] = self.counters.get("stopped", 0) + 1
        logger.info("engine stop accepted", extra={"controller": sender, "model": model})
        await self._answer(stream, {"ok": True, "state": "stopped", "model": model})

    async def _handle_blocks(self, stream: Stream, message: Mapping[str, Any], sender: PeerId) -> None:
        model, start, end = message.get("model"), message.get("start"), message.get("end")
        try:
            self.authorise(sender)
            if not isinstance(model, str) or not model or len(model) > 512:
                raise Refusal("bad_request", "'model' must be a non-empty string")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
                raise Refusal("bad_request", "'start' and 'end' must be integers")
            assert isinstance(start, int) and isinstance(end, int)
            if not 0 <= start < end:
                raise Refusal("bad_request", "blocks need 0 <= start < end (the range is [start, end))")
            if self._blocks is None:
                raise Refusal("bad_request", "this node does not serve blocks")
            refusal = self._blocks(model, start, end)
            if refusal is not None:
                raise refusal
        except Refusal as exc:
            self.counters["refused"] += 1
            await self._answer(stream, {"ok": False, "code": exc.code, "error": str(exc)})
            return
        self.counters["accepted"] += 1
        logger.info(
            "block assignment accepted",
            extra={"controller": sender, "model": model, "blocks": f"{start}-{end}"},
        )
        await self._answer(
            stream, {"ok": True, "state": "loading", "model": model, "start": start, "end": end}
        )

    @staticmethod
    async def _answer(stream: Stream, answer: dict[str, Any]) -> None:
        try:
            await write_msg(stream, answer)
        except OpenTelaError as exc:
            logger.debug("control answer not delivered: %s", exc)


def _model(message: Any) -> str:
    return str(message.get("model", ""))[:100] if isinstance(message, Mapping) else ""
