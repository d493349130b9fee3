"""The fleet controller: each round, pending models and idle nodes from the registry become a plan, and the
plan becomes assignments sent to nodes. The network is handed in as a callable, so the loop runs anywhere."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opentela._types import Lifecycle
from opentela.errors import OpenTelaError
from opentela.scheduler.drift import DriftRule, Measurement, Replan, WorkloadTracker
from opentela.scheduler.fleet import ReplicaAssignment, assign, cluster_of, idle_nodes
from opentela.scheduler.hardware import HardwareCatalog
from opentela.scheduler.placement import Plan, Problem, check_plan, get_policy
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
    served_as: Mapping[str, str] = field(default_factory=dict)
    """Workload model (a scheduler catalog name) -> the model id nodes announce, where they differ."""
    launch: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Workload model -> fields added to its ``assign`` message (``command`` template, ``engine``, ``options``)."""
    scale_out: bool = True
    """With no model pending, place every model again over the idle nodes (more replicas for popular models)."""
    refused_backoff_s: float = 300.0
    """How long a node that refused as `not_authorised` is left out of the plans."""
    drift: DriftRule = field(default_factory=DriftRule)
    """When traffic measured from usage replaces the traffic the plan was made with (`observe_usage`)."""


def assignment_message(
    a: ReplicaAssignment, engine: str, launch: Mapping[str, Any] | None = None, served_as: str | None = None
) -> dict[str, Any]:
    """The ``assign`` control message: start `a.model` with `engine` (or `launch`'s command) on GPUs `a.gpus`."""
    message: dict[str, Any] = {
        "op": "assign",
        "model": served_as or a.model,
        "tp": a.tp,
        "gpus": list(a.gpus),
        "device": a.device,
    }
    if engine:
        message["engine"] = engine
    message.update(launch or {})
    return message


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
        # peer id -> (when it was told, which model, its record's version then)
        self._in_flight: dict[str, tuple[float, str, int]] = {}
        self._refused: dict[str, float] = {}  # peer id -> when it refused as not authorised
        self.rounds = 0
        self.assigned: list[tuple[str, str]] = []  # (peer id, model) of every accepted assignment
        self.observed_rates: dict[str, float] = {}
        """Workload model -> requests per second seen at the ingress; replaces the configured rate."""
        self.tracker = WorkloadTracker(config.workloads, config.drift)
        """The traffic the plans are made with, and when measured usage drifted far enough to change it."""
        self.last_plan: Plan | None = None
        """The plan of the latest round that made one."""

    def __repr__(self) -> str:
        return f"<FleetController rounds={self.rounds} in_flight={len(self._in_flight)}>"

    def reserve(self, peer_id: str, what: str, version: int = 0) -> None:
        """Leave `peer_id` out of the plans while it starts `what`, which another planner assigned it."""
        self._in_flight[peer_id] = (time.monotonic(), what, version)

    def served_id(self, model: str) -> str:
        """The model id nodes announce for workload model `model`."""
        return self.config.served_as.get(model, model)

    def pending(self, records: Sequence[Any]) -> list[Workload]:
        """Workloads whose model no live node serves yet, nor is being started on one."""
        starting = {model for _, model, _ in self._in_flight.values()}
        served = {
            m.id
            for r in records
            if Lifecycle(r.lifecycle) in (Lifecycle.JOIN, Lifecycle.SERVING)
            for m in r.models
        }
        return [
            w
            for w in self.workloads()
            if w.rate > 0 and w.model not in starting and self.served_id(w.model) not in served
        ]

    def workloads(self) -> list[Workload]:
        """This round's workloads: measured ones adopted from usage, else the configured ones at the rate
        observed at the ingress where one is known."""
        return [self._traffic(w) for w in self.config.workloads]

    def _traffic(self, w: Workload) -> Workload:
        if w.model in self.tracker.adopted:
            return self.tracker.adopted[w.model]
        if w.model in self.observed_rates:
            return replace(w, rate=self.observed_rates[w.model])
        return w

    def observe_usage(self, measured: Mapping[str, Measurement], now: float) -> Replan | None:
        """Take traffic measured from usage (by workload model); a Replan when it drifted from the plan's.

        The next round plans with the adopted traffic; what it assigns goes out as every round's does.
        """
        replan = self.tracker.observe(measured, now)
        if replan is not None:
            for model, reasons in replan.reasons.items():
                logger.info("workload.drift", extra={"model": model, "reasons": "; ".join(reasons)})
        return replan

    def decide(
        self, now: float | None = None, records: Sequence[Any] | None = None
    ) -> list[ReplicaAssignment]:
        """This round's assignments (blocking: simulation and solve); empty when there is nothing to do."""
        now = time.monotonic() if now is None else now
        records = list(self._records()) if records is None else records
        self._settle(records, now)
        self._in_flight = {
            p: entry for p, entry in self._in_flight.items() if now - entry[0] < self.config.assign_timeout_s
        }
        self._refused = {p: t for p, t in self._refused.items() if now - t < self.config.refused_backoff_s}
        nodes = [
            n
            for n in idle_nodes(records)
            if n.peer_id not in self._in_flight and n.peer_id not in self._refused
        ]
        if not nodes:
            return []
        wanted = self.pending(records)
        if not wanted and self.config.scale_out:
            # Unallocated resources serve the models with traffic; running replicas stay where they are.
            wanted = [w for w in self.workloads() if w.rate > 0]
        if not wanted:
            return []
        # Every model placed must be served, so with fewer devices than models the most requested go first.
        wanted = sorted(wanted, key=lambda w: -w.rate)[: sum(n.devices for n in nodes)]
        while wanted:
            assignments = self._place(wanted, nodes)
            if assignments is not None:
                return assignments
            wanted = wanted[:-1]
        return []

    def _settle(self, records: Sequence[Any], now: float) -> None:
        """Forget in-flight nodes that now serve, and back off from those whose assigned engine failed."""
        by_peer = {r.peer_id: r for r in records}
        for peer, (_, model, version) in list(self._in_flight.items()):
            record = by_peer.get(peer)
            if record is None:
                continue
            if record.models:
                del self._in_flight[peer]
            elif record.version > version and str(record.reason).startswith("assignment failed"):
                del self._in_flight[peer]
                self._refused[peer] = now
                logger.warning(
                    "assign.failed", extra={"peer_id": peer, "model": model, "reason": record.reason}
                )

    def _place(self, wanted: Sequence[Workload], nodes: Sequence[Any]) -> list[ReplicaAssignment] | None:
        """A plan of `wanted` over `nodes`, packed onto them; None when no placement serves all of them."""
        cluster = cluster_of(nodes, self._catalog)
        try:
            problem = Problem(
                cluster,
                list(wanted),
                TableBuilder(settings=self.config.settings),
                time_limit_s=self.config.time_limit_s,
            )
            plan = get_policy(self.config.policy).place(problem)
        except OpenTelaError as exc:
            logger.warning("placement.failed", extra={"error": str(exc), "models": len(wanted)})
            return None
        violations = check_plan(problem, plan)
        if violations:
            logger.error(
                "placement.invalid", extra={"policy": self.config.policy, "errors": "; ".join(violations)}
            )
            return None
        self.last_plan = plan
        logger.info(
            "placement.planned",
            extra={
                "policy": plan.policy,
                "groups": ", ".join(f"{g.model} {g.dp}x TP{g.tp} {g.device}" for g in plan.groups),
            },
        )
        assignments, missing = assign(plan, nodes, one_per_node=True)
        if missing:
            logger.warning("placement.unplaced", extra={"replicas": len(missing)})
        return assignments

    async def run_round(self) -> list[tuple[ReplicaAssignment, dict[str, Any]]]:
        """Decide off the event loop, then send every assignment; a peer that fails is free again next round."""
        self.rounds += 1
        # The records are read here, on the event loop that updates them; the solve runs in a thread.
        records = list(self._records())
        assignments = await asyncio.to_thread(self.decide, None, records)
        versions = {r.peer_id: r.version for r in records}
        results = []
        for a in assignments:
            self._in_flight[a.peer_id] = (time.monotonic(), a.model, versions.get(a.peer_id, 0))
            try:
                message = assignment_message(
                    a, self.config.engine, self.config.launch.get(a.model), self.served_id(a.model)
                )
                answer = await self._send(a.peer_id, message)
            except (OpenTelaError, OSError, TimeoutError) as exc:
                answer = {"ok": False, "error": str(exc) or type(exc).__name__}
            if not answer.get("ok"):
                self._in_flight.pop(a.peer_id, None)
                if answer.get("code") == "not_authorised":
                    self._refused[a.peer_id] = time.monotonic()
                logger.warning(
                    "assign.refused",
                    extra={
                        "peer_id": a.peer_id,
                        "model": a.model,
                        "code": answer.get("code", ""),
                        "error": answer.get("error", ""),
                    },
                )
            else:
                self.assigned.append((a.peer_id, a.model))
                logger.info("assign.accepted", extra={"peer_id": a.peer_id, "model": a.model, "tp": a.tp})
            results.append((a, answer))
        return results

    async def run(self) -> None:
        """Rounds every `interval_s` until cancelled."""
        while True:
            await self.run_round()
            await asyncio.sleep(self.config.interval_s)
