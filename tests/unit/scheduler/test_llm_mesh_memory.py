"""LLM-Mesh's memory subsystem: Eq. 2, watermark scaling, the scaling cost, and the Tomasulo-style orchestrator."""

from __future__ import annotations

import pytest

from opentela.engines.headroom import RequestState, Slo
from opentela.scheduler.llm_mesh.memory import GB, ScalingCost, Watermark, kv_require_bytes
from opentela.scheduler.llm_mesh.orchestrator import MemoryOrchestrator

SLO = Slo(2.0, 0.25)


def test_require_counts_the_average_output_and_never_less_than_l_min() -> None:
    short = [RequestState(0.0, SLO, 100, 0), RequestState(0.0, SLO, 200, 300)]
    # (100 + max(0, 200)) + (200 + max(300, 200)) = 800 tokens, over L_min = 500
    assert kv_require_bytes(short, 200, 500, 2.0) == 1600
    assert kv_require_bytes(short[:1], 200, 500, 2.0) == 1000  # 300 tokens, raised to L_min
    assert kv_require_bytes([], 200, 500, 2.0) == 1000


def test_watermark_scales_up_early_and_down_lazily() -> None:
    w = Watermark(0.2)
    assert w.grow_to(10.0, 12.0) == pytest.approx(14.4)  # straight to M_recommend, not to M_require
    assert w.grow_to(12.0, 12.0) is None
    # After a finish the requirement fell to 11: M_recommend 13.2 is below 14.4, but not a watermark below.
    assert w.shrink_to(14.4, 11.0) is None
    assert w.shrink_to(14.4, 9.0) == pytest.approx(10.8)  # 10.8 * 1.2 = 12.96 < 14.4: down to M_recommend


def test_scaling_cost_matches_figure_8() -> None:
    cost = ScalingCost()
    assert cost.seconds(32 * GB, 16 * GB) == pytest.approx(0.3)
    assert cost.seconds(32 * GB, 64 * GB) == pytest.approx(1.9)
    assert cost.seconds(32 * GB, 48 * GB) == pytest.approx(1.9 * 48 / 64)


def test_a_growth_waits_in_the_station_until_a_shrink_completes() -> None:
    mem = MemoryOrchestrator(100.0, lambda old, new: 1.0)
    a, started = mem.submit("a", 80.0)
    assert a is not None and started == [a]
    mem.complete(a)
    shrink, started = mem.submit("a", 20.0)
    assert started == [shrink] and mem.budget == 20.0  # the budget drops at once ...
    grow, started = mem.submit("b", 70.0)
    assert (
        grow is not None and started == []
    )  # ... but b must wait: a still holds 80 until the shrink is done
    assert mem.held_total == 80.0 and mem.station == [grow]
    assert mem.complete(shrink) == [grow]
    assert mem.held_total == 90.0


def test_the_budget_refuses_what_cannot_fit() -> None:
    mem = MemoryOrchestrator(100.0, lambda old, new: 1.0)
    mem.submit("a", 60.0)
    op, started = mem.submit("b", 50.0)
    assert op is None and started == [] and mem.budget == 60.0
    assert mem.can_budget("b", 40.0) and not mem.can_budget("b", 41.0)


def test_operations_on_one_slot_run_in_order() -> None:
    mem = MemoryOrchestrator(100.0, lambda old, new: 1.0)
    first, _ = mem.submit("a", 50.0)
    second, started = mem.submit("a", 10.0)
    assert started == [] and second is not None
    assert mem.complete(first) == [second] and second.old == 50.0
