"""Property tests: every planner's placement fits memory (Eq. 2/5/15) and routes cover all blocks when feasible."""

from __future__ import annotations

from bprr_helpers import instances
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.scheduler.bprr import (
    Instance,
    Plan,
    cg_bp,
    cg_bprr,
    memory_violations,
    optimized_number,
    optimized_order,
    petals_placement,
    placement_feasible,
    route_plan,
    solution_is_feasible,
    theorem_bound,
)


def _fits(inst: Instance, plan: Plan) -> None:
    """Blocks plus the caches the plan reserves fit each server's memory (Eq. 2)."""
    model = inst.model
    for j, server in enumerate(inst.servers):
        reserved = model.block_bytes * plan.placement.counts[j] + model.cache_bytes * plan.cache_slots[j]
        assert reserved <= server.memory_bytes, (j, plan.algorithm)
    assert not memory_violations(inst, plan.placement)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_cg_bprr_is_feasible_within_memory_and_bounded(inst: Instance) -> None:
    plan = cg_bprr(inst)
    _fits(inst, plan)
    assert plan.feasible == placement_feasible(inst, max(inst.n_requests, 1))  # Eq. (18): iff
    if plan.feasible:
        assert plan.routing is not None and plan.mean_token_time_s is not None
        assert solution_is_feasible(inst, plan.placement, plan.routing)  # Eq. (5) for all |R| at once
        for j in range(len(inst.servers)):
            assert plan.routing.cache_blocks(j) <= plan.cache_slots[j]
        bound = theorem_bound(inst, plan.placement.counts)
        assert bound is not None and plan.mean_token_time_s <= bound + 1e-9  # Theorem 3.5


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(1, 12))
def test_cg_bp_sized_for_r_serves_any_r_concurrent_sessions(inst: Instance, r: int) -> None:
    """Corollary 3.6: |R| sessions on their best chains always fit, whichever clients they come from."""
    plan = cg_bp(inst, r)
    _fits(inst, plan)
    assert plan.feasible == placement_feasible(inst, r)
    if plan.feasible:
        routed = route_plan(inst, plan)
        assert routed.routing is not None
        for j in range(len(inst.servers)):
            per_session = max(
                sum(h.n_blocks for h in rt.hops if h.server == j) for rt in routed.routing.routes
            )
            assert r * per_session <= plan.cache_slots[j]


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(1, 12))
def test_petals_and_ablations_fit_memory_and_route_when_they_cover(inst: Instance, r: int) -> None:
    for plan in (petals_placement(inst), optimized_order(inst, r), optimized_number(inst, r)):
        _fits(inst, plan)
        if plan.feasible:
            for router in ("petals", "shortest"):
                routed = route_plan(inst, plan, router)  # type: ignore[arg-type]
                assert routed.routing is not None
                for route in routed.routing.routes:
                    assert route.hops[0].first_block == 0 and route.hops[-1].end_block == inst.model.n_blocks


@settings(max_examples=200, deadline=None)
@given(instances())
def test_petals_covers_the_model_whenever_its_blocks_suffice(inst: Instance) -> None:
    plan = petals_placement(inst)
    assert plan.feasible == (sum(plan.placement.counts) >= inst.model.n_blocks)
