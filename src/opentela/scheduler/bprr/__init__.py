"""Block placement and request routing (BPRR) for a model split across servers by contiguous block ranges.

Sun et al., "Optimizing resource allocation for geographically-distributed inference by large language models":
the problem and its cost models (`problem`), CG-BPRR and CG-BP (`cg_bprr`), the |R| rule (`concurrency`), the
exact MILP (`milp`) and PETALS' placement with the paper's ablations (`petals`). The online routers (shortest
path, WS-RR, PETALS' own) live in `opentela.chain_routing`, shared with the gateway.
"""

from opentela.scheduler.bprr.cg_bprr import (
    amortized_times,
    cg_bp,
    cg_bprr,
    conservative_counts,
    greedy_starts,
    lower_bound,
    session_capacity,
    shortest_path_routing,
    theorem_bound,
)
from opentela.scheduler.bprr.concurrency import (
    choose_concurrency,
    expected_concurrency,
    max_guaranteed_concurrency,
    placement_feasible,
)
from opentela.scheduler.bprr.milp import solve_milp
from opentela.scheduler.bprr.petals import (
    optimized_number,
    optimized_order,
    petals_block_count,
    petals_cache_slots,
    petals_placement,
)
from opentela.scheduler.bprr.problem import (
    Hop,
    Instance,
    ModelSpec,
    Network,
    Objective,
    Placement,
    Route,
    Routing,
    ServerSpec,
    chain_is_feasible,
    mean_token_time,
    memory_violations,
    route_first_token_time,
    route_from_chain,
    route_token_time,
    route_total_time,
    server_memory,
    solution_is_feasible,
)
from opentela.scheduler.bprr.solution import Plan, chain_to_route, client_spans, free_cache_slots, route_plan

__all__ = [
    "Hop",
    "Instance",
    "ModelSpec",
    "Network",
    "Objective",
    "Placement",
    "Plan",
    "Route",
    "Routing",
    "ServerSpec",
    "amortized_times",
    "cg_bp",
    "cg_bprr",
    "chain_is_feasible",
    "chain_to_route",
    "choose_concurrency",
    "client_spans",
    "conservative_counts",
    "expected_concurrency",
    "free_cache_slots",
    "greedy_starts",
    "lower_bound",
    "max_guaranteed_concurrency",
    "mean_token_time",
    "memory_violations",
    "optimized_number",
    "optimized_order",
    "petals_block_count",
    "petals_cache_slots",
    "petals_placement",
    "placement_feasible",
    "route_first_token_time",
    "route_from_chain",
    "route_plan",
    "route_token_time",
    "route_total_time",
    "server_memory",
    "session_capacity",
    "shortest_path_routing",
    "solution_is_feasible",
    "solve_milp",
    "theorem_bound",
]
