"""RaidServe in the simulator: per-rank step times, Alg. 1's water filling, and continuous batching on a layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.raidserve import plan_layout
from opentela.scheduler.raidserve.cost import LayoutCost, RankBatch, balanced_batch
from opentela.scheduler.raidserve.replica_sim import ReplicaSim, water_fill
from opentela.scheduler.roofline import Precision, StepCost

H100 = builtin_catalog()["H100-SXM"]
LLAMA = load_model("Llama-3.1-70B-Instruct")


@pytest.mark.parametrize("decodes,context", [(64, 8000), (256, 2000), (8, 30000)])
def test_uniform_layouts_cost_what_the_serving_simulator_says(decodes: int, context: int) -> None:
    """Standard TP8 through the per-rank model agrees with the simulator's aggregate step cost."""
    ours = LayoutCost(plan_layout(LLAMA, 8, "standard"), H100).time(balanced_batch(8, decodes, context))
    theirs = StepCost(LLAMA, H100, 8, Precision("bf16", "bf16", "bf16")).time(
        decodes, decodes, decodes * context, decodes, 0, 0
    )
    assert ours == pytest.approx(theirs, rel=0.05)


def test_the_slowest_rank_sets_the_pace_and_hybrid_attention_evens_it() -> None:
    batch = balanced_batch(7, 128, 8000)
    naive = LayoutCost(plan_layout(LLAMA, 7, "nonuniform"), H100).time(batch)
    hybrid = LayoutCost(plan_layout(LLAMA, 7, "raidserve"), H100).time(batch)
    tp4 = LayoutCost(plan_layout(LLAMA, 4, "standard"), H100).time(balanced_batch(4, 128, 8000))
    assert hybrid < naive and hybrid < tp4
    # One long prompt alone gives the replicated head to one rank per layer: no better than naive.
    alone = balanced_batch(7, 0, 0, [8000])
    assert LayoutCost(plan_layout(LLAMA, 7, "raidserve"), H100).time(alone) == pytest.approx(
        LayoutCost(plan_layout(LLAMA, 7, "nonuniform"), H100).time(alone), rel=0.02
    )
    # Spread over the ranks (what Alg. 1 builds), the same tokens go faster.
    spread = RankBatch(np.zeros(7), np.zeros(7), np.full(7, 8000 / 7), np.full(7, (8000 / 7) ** 2))
    assert LayoutCost(plan_layout(LLAMA, 7, "raidserve"), H100).time(spread) < LayoutCost(
        plan_layout(LLAMA, 7, "raidserve"), H100
    ).time(alone)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=8), st.integers(0, 3000))
def test_water_filling_spends_the_budget_evenly(available: list[int], budget: int) -> None:
    avail = np.asarray(available)
    take = water_fill(avail, budget)
    assert take.sum() == min(budget, avail.sum())
    assert (take >= 0).all() and (take <= avail).all()
    open_ranks = take < avail  # ranks that could have taken more got no less than any other, minus one
    if open_ranks.any():
        assert take.max() - take[open_ranks].min() <= 1


def run_small(mode: str, n: int, **kw: object) -> ReplicaSim:
    sim = ReplicaSim(plan_layout(LLAMA, n, mode), H100, **kw)  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    for i in range(60):
        sim.submit(i * 0.05, int(rng.integers(100, 4000)), int(rng.integers(10, 300)))
    return sim


@pytest.mark.parametrize("mode,n", [("standard", 4), ("nonuniform", 7), ("raidserve", 7)])
def test_every_request_finishes_with_its_tokens_and_memory_holds(mode: str, n: int) -> None:
    sim = run_small(mode, n)
    expected = sum(r.output for r in sim.waiting)
    while sim.waiting or sim.running:
        if sim.step() == 0.0:
            sim.now = min(r.arrival for r in sim.waiting)
        assert (sim._usage() <= sim._capacity).all()
    assert sim.stats.finished == 60 and sim.stats.generated == expected
    assert len(sim.stats.ttft) == 60 and all(t >= 0 for t in sim.stats.ttft)


def test_a_tight_cache_preempts_and_recomputes_without_losing_requests() -> None:
    sim = ReplicaSim(plan_layout(LLAMA, 4, "standard"), H100)
    for _ in range(120):
        sim.submit(0.0, 3000, 4000)  # 120 x 7K tokens: more than TP4's 500K tokens of cache
    while sim.waiting or sim.running:
        sim.step()
        assert (sim._usage() <= sim._capacity).all()
    assert sim.stats.preempted > 0 and sim.stats.prefilled > 120 * 3000  # the preempted were prefilled again
    assert sim.stats.finished == 120 and sim.stats.generated == 120 * 4000


def test_reconfiguring_keeps_the_cache_or_recomputes_it() -> None:
    kept, lost = run_small("raidserve", 8), run_small("raidserve", 8)
    for sim in (kept, lost):
        sim.run_until(5.0)
    before = kept.stats.prefilled
    assert kept.running
    kept.reconfigure(
        plan_layout(LLAMA, tuple(d for d in range(8) if d != 3), "raidserve"), 0.2, keep_cache=True
    )
    lost.reconfigure(plan_layout(LLAMA, 7, "standard"), 10.0, keep_cache=False)
    assert kept.running and not lost.running and kept.now < lost.now
    for sim in (kept, lost):
        sim.run_until(60.0)
    assert lost.stats.prefilled - before > kept.stats.prefilled - before  # the lost caches were re-prefilled


def test_a_decode_instance_takes_prompts_computed_and_recompute_prefills_them_again() -> None:
    sim = ReplicaSim(plan_layout(LLAMA, 8, "raidserve"), H100)
    for i in range(20):
        sim.submit(i * 0.1, 8000, 200, prefilled=True)
    sim.run_until(3.0)
    assert sim.stats.prefilled == 0 and sim.running
    held = sum(r.context for r in sim.running)
    sim.reconfigure(plan_layout(LLAMA, 7, "raidserve"), 0.1, keep_cache=False)
    sim.run_until(60.0)
    assert sim.stats.prefilled >= held and sim.stats.finished == 20
