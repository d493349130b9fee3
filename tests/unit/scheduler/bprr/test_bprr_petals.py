"""PETALS' block placement (the baseline) and the Section 4.3 ablations."""

from __future__ import annotations

from bprr_helpers import instance, model

from opentela.scheduler.bprr import (
    ModelSpec,
    ServerSpec,
    cg_bp,
    conservative_counts,
    free_cache_slots,
    optimized_number,
    optimized_order,
    petals_block_count,
    petals_cache_slots,
    petals_placement,
)
from opentela.scheduler.bprr.petals import choose_start


def test_block_count_reserves_a_fixed_cache_whatever_the_load() -> None:
    spec = ModelSpec("m", 70, block_bytes=1000, cache_bytes_per_token=1, input_len=20, output_len=128)
    server = ServerSpec("gpu", memory_bytes=50_000, tau_decode_s=0.01, tau_prefill_s=0.05)
    inst = instance(spec, [50_000], [0.01], [[0.1]], [1])
    assert petals_block_count(inst, server) == 50_000 // (1000 + 4096)  # 9 blocks
    assert petals_block_count(inst, server, reserve_bytes=10_000) == 40_000 // 5096
    assert petals_cache_slots(inst, 9) == 9 * 4096 // 148  # block-sessions of 148 tokens
    many = instance(spec, [50_000], [0.01], [[0.1]], [40])
    assert petals_placement(many).placement.counts == (9,)  # 40 sessions do not change it
    assert conservative_counts(many, 40) == (50_000 // (1000 + 148 * 40),)  # CG-BP does: 7


def test_window_choice_is_lexicographic_on_sorted_throughputs() -> None:
    assert choose_start([5.0, 0.0, 0.0, 3.0], 2) == 1
    assert choose_start([1.0, 1.0, 1.0], 2) == 0  # ties: the first window
    assert choose_start([2.0, 1.0, 3.0, 1.0], 2) == 0  # (1, 2) < (1, 3)


def test_servers_join_in_order_and_fill_the_least_served_blocks() -> None:
    spec = model(6, block_bytes=10, cache_bytes=0)
    inst = instance(spec, [40, 40, 40], [0.01, 0.02, 0.01], [[0.1, 0.1, 0.1]], [1])
    plan = petals_placement(inst)
    assert plan.placement.counts == (4, 4, 4)
    assert plan.placement.starts[0] == 0 and plan.placement.starts[1] == 2  # covers blocks 4, 5
    assert plan.feasible
    reordered = petals_placement(inst, order=[1, 0, 2])
    assert reordered.placement.starts[1] == 0


def test_ablations_change_one_aspect_each() -> None:
    spec = model(8, block_bytes=10, cache_bytes=2)
    memories = [120, 60, 300]
    inst = instance(spec, memories, [0.05, 0.01, 0.02], [[0.1, 0.1, 0.1]], [3])
    base = petals_placement(inst)
    order = optimized_order(inst, 3)
    number = optimized_number(inst, 3)
    assert order.placement.counts == base.placement.counts  # same PETALS counts, another join order
    assert number.placement.counts == conservative_counts(inst, 3) == cg_bp(inst, 3).placement.counts
    assert number.cache_slots == tuple(free_cache_slots(inst, number.placement, j) for j in range(3))
    assert order.algorithm == "petals-optimized-order" and number.algorithm == "petals-optimized-number"
