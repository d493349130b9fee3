"""The default placement policy: CP-SAT over the allocation matrix and DP x TP, minimising simulated mean E2E."""

from __future__ import annotations

import os
import time

from ortools.sat.python import cp_model

from opentela.errors import CapacityError
from opentela.scheduler.placement import Group, Plan, Problem, Progress, register_policy

LATENCY_CAP_S = 3600.0
"""Latencies beyond an hour all mean 'hopelessly overloaded'; capping keeps the integer costs small."""


class _Reporter(cp_model.CpSolverSolutionCallback):
    def __init__(self, progress: Progress | None, limit: float) -> None:
        super().__init__()
        self.progress, self.limit, self.started = progress, limit, time.perf_counter()

    def on_solution_callback(self) -> None:
        if self.progress:
            elapsed = time.perf_counter() - self.started
            self.progress(f"solving: best {self.ObjectiveValue():,.0f}", min(elapsed / self.limit, 1.0))


@register_policy("cpsat")
class CpSatPolicy:
    """Minimise the mean end-to-end latency over all requests (the paper's Eq. 1).

    One boolean per (model m, device type n, tp, dp, k): model m runs dp replicas of tp devices of type n and
    sends k/K of its traffic there. At most one choice per (m, n); the shares of a model sum to K; C1 bounds
    the devices per type; C2 is enforced by only offering (n, tp) pairs a replica fits on; C3 holds by
    construction (a = dp x tp). Each choice costs rate x share x latency, the latency read from the
    simulator's table at the per-replica rate, so the objective is the simulated mean E2E times total rate.
    """

    name = "cpsat"

    def place(self, problem: Problem, progress: Progress | None = None) -> Plan:
        """Solve within problem.time_limit_s (table precomputation included)."""
        started = time.perf_counter()
        problem.prepare(progress)
        K = problem.shares
        model = cp_model.CpModel()
        choice: dict[tuple[int, str, int, int, int], cp_model.IntVar] = {}
        cost: dict[tuple[int, str, int, int, int], int] = {}
        for i, w in enumerate(problem.workloads):
            if w.rate <= 0:
                continue
            for name, tp in problem.options(i):
                table = problem.table(i, name, tp)
                for dp in range(1, problem.cluster.devices[name] // tp + 1):
                    for k in range(1, K + 1):
                        rate = w.rate * k / K
                        latency = min(table(rate / dp), LATENCY_CAP_S)
                        key = (i, name, tp, dp, k)
                        choice[key] = model.new_bool_var(f"x_{i}_{name}_{tp}_{dp}_{k}")
                        cost[key] = round(1000 * rate * latency)
        for i, w in enumerate(problem.workloads):
            if w.rate <= 0:
                continue
            mine = [key for key in choice if key[0] == i]
            if not mine:
                raise CapacityError(f"no device type in the cluster can host {w.model}")
            model.add(sum(key[4] * choice[key] for key in mine) == K)
            for name in problem.cluster.devices:
                model.add_at_most_one(choice[key] for key in mine if key[1] == name)
        for name, count in problem.cluster.devices.items():  # C1
            model.add(sum(key[2] * key[3] * var for key, var in choice.items() if key[1] == name) <= count)
        model.minimize(sum(cost[key] * var for key, var in choice.items()))

        solver = cp_model.CpSolver()
        remaining = max(problem.time_limit_s - (time.perf_counter() - started), 1.0)
        solver.parameters.max_time_in_seconds = remaining
        solver.parameters.num_workers = max(1, min(os.cpu_count() or 1, 8))
        status = solver.solve(model, _Reporter(progress, remaining))
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise CapacityError(
                f"no placement fits: the cluster cannot host every model ({solver.status_name(status)})"
            )
        groups = [
            Group(problem.workloads[i].model, name, tp, dp, k / K)
            for (i, name, tp, dp, k), var in choice.items()
            if solver.value(var)
        ]
        plan = Plan(self.name, groups, status=solver.status_name(status))
        plan.predicted_e2e = problem.objective(plan)
        plan.solve_seconds = time.perf_counter() - started
        plan.extra = {"variables": len(choice), "simulator_evaluations": problem.builder.evaluations}
        if progress:
            progress("done", 1.0)
        return plan
