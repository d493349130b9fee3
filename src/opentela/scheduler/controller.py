"""The fleet controller: each round, pending models and idle nodes from the registry become a plan, and the
plan becomes assignments sent to nodes. The network is handed in as a callable, so the loop runs anywhere."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentela._types import Lifecycle
from opentela.errors import OpenTelaError
from opentela.scheduler.fleet import Assignment, assign, cluster_of, idle_nodes
from opentela.scheduler.hardware import HardwareCatalog
from opentela.scheduler.placement import Problem, check_plan, get_policy
from opentela.scheduler.tables import SimSettings, TableBuilder
from opentela.scheduler.workload import Workload

logger = logging.getLogger(__name__)

Send = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Deliver one control message to a peer and return its answer (over ``/otela/control/1`` in a node)."""


@dataclass(frozen=True)
class ControllerConfig:
    """What the controller places and how often it looks."""

    workloads: Sequence[Workload]
    """Models to keep served, with their expected traffic."""
    engine: str = "vllm"
    """Engine adapter name nodes start the model with (``vllm``, ``sglang``, ``embedded``...)."""
    policy: str = "cpsat"
    """Placement policy name or import path."""
    interval_s: float = 30.0
    """Seconds between rounds."""
    assign_timeout_s: float = 600.0
    """How long a node told to start a model is left alone while its engine loads."""
    time_limit_s: float = 60.0
    """Solver time limit per round."""
    settings: SimSettings = field(default_factory=SimSettings)


def assignment_message(a: Assignment, engine: str) -> dict[str, Any]:
    """The ``assign`` control message: start `a.model` with `engine` on GPUs `a.gpus`, tensor-parallel."""
    return {
        "op": "assign",
        "model": a.model,
        "engine": engine,
        "tp": a.tp,
        "gpus": list(a.gpus),
        "device": a.device,
    }


class FleetController:
    """Assigns pending models to idle nodes; never takes nodes back from running models (as in the paper)."""

    def __init__(
        self,
        config: ControllerConfig,
        records: Callable[[], Iterable[Any]],
        send: Send,
        catalog: HardwareCatalog | None = None,
    ) -> None:
        self.config, self._records, self._send, self._catalog = config, records, send, catalog
        self._in_flight: dict[str, tuple[float, str]] = {}  # peer id -> (when it was told, which model)
        self.rounds = 0

    def __repr__(self) -> str:
        return f"<FleetController rounds={self.rounds} in_flight={len(self._in_flight)}>"

    def pending(self, records: Sequence[Any]) -> list[Workload]:
        """Workloads whose model no live node serves yet, nor is being started on one."""
        starting = {model for _, model in self._in_flight.values()}
        served = starting | {
            m.id
            for r in records
            if Lifecycle(r.lifecycle) in (Lifecycle.JOIN, Lifecycle.SERVING)
            for m in r.models
        }
        return [w for w in self.config.workloads if w.rate > 0 and w.model not in served]

    def decide(self, now: float | None = None) -> list[Assignment]:
        """This round's assignments (blocking: simulation and solve); empty when there is nothing to do."""
        now = time.monotonic() if now is None else now
        self._in_flight = {
            p: (t, m) for p, (t, m) in self._in_flight.items() if now - t < self.config.assign_timeout_s
        }
        records = list(self._records())
        pending = self.pending(records)
        nodes = [n for n in idle_nodes(records) if n.peer_id not in self._in_flight]
        if not pending or not nodes:
            return []
        cluster = cluster_of(nodes, self._catalog)
        problem = Problem(
            cluster,
            list(pending),
            TableBuilder(settings=self.config.settings),
            time_limit_s=self.config.time_limit_s,
        )
        try:
            plan = get_policy(self.config.policy).place(problem)
        except OpenTelaError as exc:
            logger.warning("placement.failed", extra={"error": str(exc), "models": len(pending)})
            return []
        violations = check_plan(problem, plan)
        if violations:
            logger.error(
                "placement.invalid", extra={"policy": self.config.policy, "errors": "; ".join(violations)}
            )
            return []
        assignments, missing = assign(plan, nodes)
        if missing:
            logger.warning("placement.unplaced", extra={"replicas": len(missing)})
        return assignments

    async def run_round(self) -> list[tuple[Assignment, dict[str, Any]]]:
        """Decide off the event loop, then send every assignment; a peer that fails is free again next round."""
        self.rounds += 1
        assignments = await asyncio.to_thread(self.decide)
        results = []
        for a in assignments:
            self._in_flight[a.peer_id] = (time.monotonic(), a.model)
            try:
                answer = await self._send(a.peer_id, assignment_message(a, self.config.engine))
            except (OpenTelaError, OSError) as exc:
                answer = {"ok": False, "error": str(exc)}
            if not answer.get("ok"):
                self._in_flight.pop(a.peer_id, None)
                logger.warning(
                    "assign.failed", extra={"peer_id": a.peer_id, "error": answer.get("error", "")}
                )
            else:
                logger.info("assign.complete", extra={"peer_id": a.peer_id, "model": a.model, "tp": a.tp})
            results.append((a, answer))
        return results

    async def run(self) -> None:
        """Rounds every `interval_s` until cancelled."""
        while True:
            await self.run_round()
            await asyncio.sleep(self.config.interval_s)
