"""The paper's compared systems, planned and simulated on one scenario: PETALS, its three ablations, CG-BP + WS-RR.

One call plans every system for the same deployment and replays the same arrivals through each, so differences
come from placement and routing alone. 'petals' joins servers in a random order and routes with PETALS' client;
'opt-order' joins them in CG-BP's order; 'opt-number' gives PETALS' block choice CG-BP's block counts (and the
rest of memory to caches); 'opt-rr' keeps PETALS' placement and solves problem (21) exactly per request;
'proposed' is CG-BP sized for |R| = mean + std of the arrivals during one session, routed by WS-RR.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from opentela.scheduler.bprr.cg_bprr import cg_bp
from opentela.scheduler.bprr.concurrency import choose_concurrency, session_time
from opentela.scheduler.bprr.petals import optimized_number, optimized_order, petals_placement
from opentela.scheduler.bprr.problem import Instance, Route
from opentela.scheduler.bprr.scenarios import PETALS_RESERVE_BYTES, Scenario, calibrated_setup
from opentela.scheduler.bprr.sim_events import CacheView, SimRequest
from opentela.scheduler.bprr.sim_routing import min_wait_router, petals_router, ws_rr_router
from opentela.scheduler.bprr.simulator import Router, SimConfig, make_requests, poisson_arrivals, simulate
from opentela.scheduler.bprr.solution import Plan

SYSTEMS = ("petals", "opt-order", "opt-number", "opt-rr", "proposed")
Mode = Literal["calibrated", "model"]
"""'calibrated': the authors' per-session setup constants; 'model': Eq. (1) and waiting only."""


@dataclass
class TimedRouter:
    """A router that adds up the wall time its decisions take (the routing half of the paper's Table 6)."""

    inner: Router
    spent_s: float = 0.0

    def __call__(self, request: SimRequest, view: CacheView) -> Route | None:
        """The inner router's choice, timed."""
        began = time.perf_counter()
        try:
            return self.inner(request, view)
        finally:
            self.spent_s += time.perf_counter() - began


@dataclass(frozen=True)
class SystemRun:
    """One system on one scenario and arrival sequence: its plan, the simulated metrics and its running time."""

    system: str
    plan: Plan
    metrics: dict[str, float]
    plan_s: float
    """Wall time of the placement (and of choosing |R|)."""
    route_s: float
    """Wall time of all routing decisions."""


def session_concurrency(
    instance: Instance, rate_per_s: float, setup_s: float = 0.0, max_rounds: int = 20
) -> int:
    """|R| = mean + std of arrivals during one session, the session on CG-BP's chain for |R| plus its setup.

    The session holds its caches during the setup too, so the setup counts; iterate from |R| = 1 (more
    concurrency, fewer blocks per server, longer chains) to the fixed point, capped by Eq. (19).
    """
    r = 1
    for _ in range(max_rounds):
        duration = session_time(instance, r)
        if math.isinf(duration):
            return r
        nxt = choose_concurrency(instance, rate_per_s, session_s=duration + setup_s)
        if nxt <= r:
            return r
        r = nxt
    return r


def petals_instance(scenario: Scenario) -> Instance:
    """The instance PETALS' placement sees: its throughput reads the forward speed PETALS measured on each GPU."""
    n_in = scenario.instance.model.input_len
    servers = tuple(
        replace(s, tau_prefill_s=n_in / k.forward_rps)
        for s, k in zip(scenario.instance.servers, scenario.kinds, strict=True)
    )
    return replace(scenario.instance, servers=servers)


def setup_s(system: str, mode: Mode) -> float:
    """Seconds each session spends before prefill under `mode` (PETALS' ablations keep PETALS' constant)."""
    return (
        calibrated_setup("proposed" if system == "proposed" else "petals").total_s
        if mode == "calibrated"
        else 0.0
    )


def plan_system(
    system: str, scenario: Scenario, rate_per_s: float, order: Sequence[int], mode: Mode
) -> tuple[Plan, Router, float]:
    """Place blocks for `system` and build its router; returns the plan, the router and the planning time."""
    inst = scenario.instance
    pings = (scenario.client_ping_s,)
    began = time.perf_counter()
    concurrency = 0  # |R|, which only the CG-BP-sized systems need
    if system in ("proposed", "opt-order", "opt-number"):
        concurrency = session_concurrency(inst, rate_per_s, setup_s("proposed", mode))
    if system == "proposed":
        plan = cg_bp(inst, concurrency)
    elif system == "opt-order":
        plan = optimized_order(petals_instance(scenario), concurrency, reserve_bytes=PETALS_RESERVE_BYTES)
    elif system == "opt-number":
        plan = optimized_number(petals_instance(scenario), concurrency, order=order)
    elif system in ("petals", "opt-rr"):
        network = [k.network_rps for k in scenario.kinds]
        plan = petals_placement(
            petals_instance(scenario), order=order, reserve_bytes=PETALS_RESERVE_BYTES, network_rps=network
        )
    else:
        raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")
    router: Router
    if system == "proposed":
        router = ws_rr_router(inst, plan.placement, plan.cache_slots)
    elif system == "opt-rr":
        router = min_wait_router(inst, plan.placement, plan.cache_slots)
    else:
        router = petals_router(inst, plan.placement, plan.cache_slots, pings, scenario.server_ping_s)
    return plan, router, time.perf_counter() - began


def run_systems(
    scenario: Scenario,
    rate_per_s: float,
    n_requests: int,
    rng: np.random.Generator,
    *,
    mode: Mode = "calibrated",
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, SystemRun]:
    """Every system on the same arrivals and the same random join order; PETALS' client retries when full."""
    requests = make_requests(
        poisson_arrivals(rng, rate_per_s, n_requests), scenario.instance.model.output_len
    )
    order = [int(j) for j in rng.permutation(scenario.n_servers)]
    out = {}
    for system in systems:
        plan, router, plan_s = plan_system(system, scenario, rate_per_s, order, mode)
        timed = TimedRouter(router)
        config = SimConfig(admission="backoff", setup_s=setup_s(system, mode))
        metrics: dict[str, float]
        if plan.placement.covers_all():
            metrics = simulate(scenario.instance, plan.cache_slots, timed, requests, config).summary()
        else:  # some block is on no server: nothing can be served
            metrics = {"per_token_s": math.nan, "rejected": float(n_requests)}
        metrics.update(_placement_stats(scenario, plan))
        out[system] = SystemRun(system, plan, metrics, plan_s, timed.spent_s)
    return out


def _placement_stats(scenario: Scenario, plan: Plan) -> dict[str, float]:
    """Blocks per server of each GPU kind (mean over used servers) and the |R| the plan was sized for."""
    stats: dict[str, float] = {"concurrency": float(plan.concurrency)}
    for kind in {k.name for k in scenario.kinds}:
        counts = [m for m, k in zip(plan.placement.counts, scenario.kinds, strict=True) if k.name == kind]
        stats[f"blocks[{kind}]"] = float(np.mean(counts))
    return stats
