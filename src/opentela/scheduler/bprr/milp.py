"""The BPRR MILP (13) with the McCormick linearization of Appendix B.3, solved exactly by SCIP (or CBC).

Variables are per request r and logical link (i, j): f^r_ij (binary), and alpha = a_j f, beta = a_i f,
gamma = m_j f, delta = m_i f. Clients are constants (the S-client holds dummy block 0, a + m = 1 in the paper's
1-based numbering; the D-client holds block L + 1), so their products are written out directly. Sizes grow as
|R| x |E| = |R| x |V_s| (|V_s| + 2 |V_c|): meant for a few servers and a few requests.
"""

from __future__ import annotations

import time
from typing import Any

from ortools.linear_solver import pywraplp  # type: ignore[import-untyped]

from opentela.scheduler.bprr.problem import (
    Instance,
    Objective,
    Placement,
    Routing,
    mean_token_time,
    route_from_chain,
)
from opentela.scheduler.bprr.solution import Plan, Status, free_cache_slots

_STATUS: dict[int, Status] = {
    pywraplp.Solver.OPTIMAL: "optimal",
    pywraplp.Solver.FEASIBLE: "feasible",
    pywraplp.Solver.INFEASIBLE: "infeasible",
}


def _link_costs(instance: Instance, client: int, j: int, objective: Objective) -> tuple[float, float]:
    """(per-link constant, per-processed-block) cost at server j: Eq. (4), or Eq. (8) for all tokens."""
    server, net = instance.servers[j], instance.network
    if objective == "decode":
        return net.token_rtt_s[client][j], server.tau_decode_s
    n = instance.model.output_len
    fixed = (net.input_rtt_s[client][j] + (n - 1) * net.token_rtt_s[client][j]) / n
    return fixed, (server.tau_prefill_s + (n - 1) * server.tau_decode_s) / n


def solve_milp(
    instance: Instance,
    *,
    objective: Objective = "decode",
    time_limit_s: float = 30.0,
    fixed_placement: Placement | None = None,
    solver: str = "SCIP",
) -> Plan:
    """Solve (13) for the offline instance; with `fixed_placement`, solve the routing subproblem (16) instead."""
    began = time.perf_counter()
    mip = pywraplp.Solver.CreateSolver(solver) or pywraplp.Solver.CreateSolver("CBC")
    if mip is None:
        raise RuntimeError("OR-Tools offers neither SCIP nor CBC")
    mip.SetTimeLimit(int(time_limit_s * 1000))
    n, servers = instance.model.n_blocks, range(len(instance.servers))
    s_m, s_c = instance.model.block_bytes, instance.model.cache_bytes

    # Block placement in the paper's 1-based numbering: server j holds {a_j, ..., a_j + m_j - 1}. m_j may be 0 (the
    # paper's m_j >= 1 would force every server to hold a block even when it cannot hold one).
    a: list[Any] = []
    m: list[Any] = []
    for j in servers:
        if fixed_placement is None:
            a.append(mip.IntVar(1, n, f"a{j}"))
            m.append(mip.IntVar(0, n, f"m{j}"))
            mip.Add(a[j] + m[j] - 1 <= n)  # (13d)
        else:
            a.append(fixed_placement.starts[j] + 1)
            m.append(fixed_placement.counts[j])

    cost_terms: list[Any] = []
    cache_terms: list[list[Any]] = [[] for _ in servers]
    links: list[dict[tuple[str | int, str | int], Any]] = []
    for r, client in enumerate(instance.request_clients()):
        src, dst = "S", "D"
        f: dict[tuple[str | int, str | int], Any] = {}
        for j in servers:
            f[src, j] = mip.BoolVar(f"f{r}_S_{j}")
            f[j, dst] = mip.BoolVar(f"f{r}_{j}_D")
            for k in servers:
                if k != j:
                    f[k, j] = mip.BoolVar(f"f{r}_{k}_{j}")
        links.append(f)
        for v in [
            src,
            dst,
            *servers,
        ]:  # (13c) flow conservation, d = 1 at the S-client and -1 at the D-client
            out = sum(f[e] for e in f if e[0] == v)
            into = sum(f[e] for e in f if e[1] == v)
            mip.Add(out - into == (1 if v == src else -1 if v == dst else 0))

        def product(x: Any, ub: int, flag: Any, name: str) -> Any:
            """A variable equal to x * flag for binary flag and 0 <= x <= ub (B.4-B.7)."""
            if isinstance(x, int):
                return x * flag
            y = mip.NumVar(0, ub, name)
            mip.Add(y <= ub * flag)  # (B.*a)
            mip.Add(y <= x)  # (B.*b)
            mip.Add(x + ub * flag - y <= ub)  # (B.*c)
            return y

        for (tail, head), flag in f.items():
            tag = f"{r}_{tail}_{head}"
            # alpha = a_j f, gamma = m_j f (the D-client: a = L + 1, m = 1); beta = a_i f, delta = m_i f (S: 0, 1).
            if head == dst:
                alpha, gamma, end_head = (n + 1) * flag, flag, n + 1
            else:
                h = int(head)
                alpha = product(a[h], n, flag, f"al{tag}")
                gamma = product(m[h], n, flag, f"ga{tag}")
                end_head = a[h] + m[h] - 1
            if tail == src:
                beta, delta, end_tail = 0, flag, 1
            else:
                t = int(tail)
                beta = product(a[t], n, flag, f"be{tag}")
                delta = product(m[t], n, flag, f"de{tag}")
                end_tail = a[t] + m[t]
            mip.Add(alpha <= end_tail)  # (13e): a_j f <= a_i + m_i
            mip.Add(beta + delta <= end_head)  # (13f): (a_i + m_i) f <= a_j + m_j - 1
            if head == dst:
                continue  # t_cc' = tau_c' = 0
            processed = alpha + gamma - beta - delta
            fixed, per_block = _link_costs(instance, client, int(head), objective)
            cost_terms.append(fixed * flag + per_block * processed)
            cache_terms[int(head)].append(processed)

    unit = s_c or s_m  # (13b) memory, in units of one cache to keep the coefficients small
    for j in servers:
        mip.Add(
            s_m / unit * m[j] + s_c / unit * sum(cache_terms[j]) <= instance.servers[j].memory_bytes / unit
        )
    mip.Minimize(sum(cost_terms))
    status = _STATUS.get(mip.Solve(), "unknown")
    return _extract(instance, status, a, m, links, objective, fixed_placement, time.perf_counter() - began)


def _extract(
    instance: Instance,
    status: Status,
    a: list[Any],
    m: list[Any],
    links: list[dict[tuple[str | int, str | int], Any]],
    objective: Objective,
    fixed: Placement | None,
    elapsed: float,
) -> Plan:
    """Read the solver's values back into a Plan (placement, routes that follow the first-holder rule)."""
    n = instance.model.n_blocks
    if status in ("infeasible", "unknown"):
        empty = fixed or Placement(n, (0,) * len(instance.servers), (0,) * len(instance.servers))
        return Plan("milp", empty, (0,) * len(instance.servers), status=status, solve_s=elapsed)
    value = lambda x: x if isinstance(x, int) else round(x.solution_value())  # noqa: E731
    counts = tuple(value(x) for x in m)
    starts = tuple(value(x) - 1 if c else 0 for x, c in zip(a, counts, strict=True))
    placement = fixed or Placement(n, starts, counts)
    routes = []
    for f, client in zip(links, instance.request_clients(), strict=True):
        nxt = {i: j for (i, j), flag in f.items() if flag.solution_value() > 0.5}
        chain, node = [], nxt["S"]
        while node != "D":
            chain.append(int(node))
            node = nxt[node]
        routes.append(route_from_chain(placement, client, chain))
    routing = Routing(tuple(routes))
    return Plan(
        algorithm="milp",
        placement=placement,
        cache_slots=tuple(free_cache_slots(instance, placement, j) for j in range(len(counts))),
        routing=routing,
        status=status,
        mean_token_time_s=mean_token_time(instance, routing, objective),
        concurrency=instance.n_requests,
        solve_s=elapsed,
    )
