"""The memP baseline: devices in proportion to arrival rate x parameter count, the largest model first."""

from __future__ import annotations

import time

from opentela.scheduler.placement import Plan, Problem, Progress, register_policy, shares_by_capacity


def _largest_remainder(weights: list[float], total: int) -> list[int]:
    quotas = [total * w / sum(weights) for w in weights] if sum(weights) else [0.0] * len(weights)
    counts = [int(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda i: quotas[i] - counts[i], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


@register_policy("memp")
class MemPPolicy:
    """Memory-proportional placement (a HexGen-style heuristic): model m gets a share of all devices
    proportional to rate_m x params_m; models are served largest first from the device types with the most
    memory, each with the smallest tensor parallelism that fits; leftovers go to the models still short."""

    name = "memp"

    def place(self, problem: Problem, progress: Progress | None = None) -> Plan:
        """Allocate by memory demand; route each model's traffic in proportion to replica throughput."""
        started = time.perf_counter()
        problem.prepare(progress)
        free = dict(problem.cluster.devices)
        demand = [w.rate * m.num_params for w, m in zip(problem.workloads, problem.models, strict=True)]
        target = _largest_remainder(demand, sum(free.values()))
        by_memory = sorted(free, key=lambda n: problem.device(n).memory_gib, reverse=True)
        order = sorted(range(len(demand)), key=lambda i: problem.models[i].num_params, reverse=True)
        chosen: list[tuple[str, str, int, int]] = []
        got = [0] * len(demand)

        def take(i: int, want: int) -> None:
            options = problem.options(i)
            for name in by_memory:
                tps = sorted(tp for n, tp in options if n == name)
                if not tps or want <= 0:
                    continue
                tp = tps[0]
                dp = min(want, free[name]) // tp
                if dp < 1:
                    continue
                chosen.append((problem.workloads[i].model, name, tp, dp))
                free[name] -= dp * tp
                got[i] += dp * tp
                want -= dp * tp

        for i in order:
            if demand[i] > 0:
                take(i, target[i])
        # Rounding to tp multiples can leave devices idle: hand them to the models furthest below target.
        for i in sorted(order, key=lambda i: got[i] - target[i]):
            if demand[i] > 0:
                take(i, sum(free.values()))
        merged: dict[tuple[str, str, int], int] = {}
        for m, n, tp, dp in chosen:
            merged[(m, n, tp)] = merged.get((m, n, tp), 0) + dp
        plan = Plan(self.name, shares_by_capacity(problem, [(*k, dp) for k, dp in merged.items()]))
        plan.predicted_e2e = problem.objective(plan)
        plan.status = "heuristic"
        plan.solve_seconds = time.perf_counter() - started
        return plan
