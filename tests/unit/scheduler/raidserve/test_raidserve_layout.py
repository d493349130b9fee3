"""RaidServe's planner: every head placed, memory within capacity, cyclic placement never worse than naive, the
paper's minimum device counts, and recoveries that keep what survives."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.errors import ConfigError
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import ModelSpec, load_model
from opentela.scheduler.raidserve.layout import (
    Layout,
    minimum_devices,
    plan_layout,
    standard_degree,
)
from opentela.scheduler.raidserve.recovery import plan_recovery
from opentela.scheduler.simulator import EngineLimits

H100 = builtin_catalog()["H100-SXM"]
LONGEST = 125_192
"""The longest request of the paper's Mooncake sample: 123,192 input and 2,000 output tokens (its Table 2)."""


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.integers(1, 16))
    group = draw(st.integers(1, 8))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    experts = draw(st.sampled_from([0, 0, 8]))
    return ModelSpec(
        name="drawn",
        hidden_size=kv * group * head_dim,
        num_layers=draw(st.integers(1, 96)),
        num_heads=kv * group,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=draw(st.integers(64, 30000)),
        vocab_size=draw(st.integers(1000, 150000)),
        max_positions=131072,
        num_experts=experts,
        experts_per_token=2 if experts else 0,
        moe_intermediate_size=draw(st.integers(64, 20000)) if experts else 0,
    )


def layouts(model: ModelSpec, n: int) -> list[Layout]:
    out = [plan_layout(model, n, "nonuniform"), plan_layout(model, n, "nonuniform", cyclic=True)]
    out += [plan_layout(model, n, "raidserve"), plan_layout(model, n, "raidserve", cyclic=False)]
    if standard_degree(model, n) is not None:
        out.append(plan_layout(model, n, "standard"))
    return out


@settings(max_examples=150, deadline=None)
@given(models(), st.integers(1, 8))
def test_every_head_and_kv_head_is_placed_once(model: ModelSpec, n: int) -> None:
    for layout in layouts(model, n):
        for layer in range(model.num_layers):
            tp = [h for r in range(layout.ranks) for h in layout.heads_at(r, layer)]
            expected_copies = layout.kv_copies
            for head in range(model.num_kv_heads):
                placed = tp.count(head) + (head in layout.replicated) * expected_copies
                assert placed == expected_copies, (layout.mode, layer, head)
        shards = sorted(s for group in layout.ffn for s in group)
        assert shards == list(range(layout.n_shards))
        heads = sum(layout.attention_heads_per_token(r) for r in range(layout.ranks))
        assert heads == pytest.approx(model.num_heads)  # every query head computed once per token


@settings(max_examples=150, deadline=None)
@given(models(), st.integers(1, 8), st.data())
def test_the_planned_batch_never_overfills_a_device(model: ModelSpec, n: int, data: st.DataObject) -> None:
    device = builtin_catalog()[data.draw(st.sampled_from(["H100-SXM", "A100-80G", "L40S"]))]
    limits = EngineLimits()
    for layout in layouts(model, n):
        tokens = layout.max_batch_tokens(device, limits)
        if tokens <= 0:
            continue
        # Any split of those tokens over the requests' base ranks fits on every device.
        cuts = sorted(
            data.draw(st.lists(st.integers(0, tokens), min_size=layout.ranks - 1, max_size=layout.ranks - 1))
        )
        per_base = [b - a for a, b in itertools.pairwise([0, *cuts, tokens])]
        for r in range(layout.ranks):
            kv = sum(t * layout.kv_bytes_per_token(r, base) for base, t in enumerate(per_base))
            assert layout.weight_bytes(r) + kv <= layout.usable_bytes(device, limits) * (1 + 1e-12)


def _spread(values: list[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


@settings(max_examples=200, deadline=None)
@given(models(), st.integers(1, 8), st.data())
def test_cyclic_placement_never_spreads_kv_more_than_naive(
    model: ModelSpec, n: int, data: st.DataObject
) -> None:
    """Whatever the requests' base ranks (a skewed router included), cyclic placement's max/min KV bytes per
    device is at most naive placement's."""
    for mode in ("nonuniform", "raidserve"):
        naive = plan_layout(model, n, mode, cyclic=False)
        cyclic = plan_layout(model, n, mode, cyclic=True)
        per_base = data.draw(st.lists(st.integers(0, 1000), min_size=naive.ranks, max_size=naive.ranks))
        if not any(per_base):
            continue
        spreads = [
            _spread(
                [sum(t * x.kv_bytes_per_token(r, b) for b, t in enumerate(per_base)) for r in range(x.ranks)]
            )
            for x in (naive, cyclic)
        ]
        assert spreads[1] <= spreads[0] * (1 + 1e-9), (mode, per_base)


def test_the_paper_minimum_device_counts_and_fallbacks() -> None:
    """RaidServe Fig. 9: Llama-3.1-70B needs 3 H100s, Mixtral-8x22B 5; Standard TP falls back to 4 or finds none."""
    llama, mixtral = load_model("Llama-3.1-70B-Instruct"), load_model("Mixtral-8x22B-v0.1")
    assert [minimum_devices(m, H100, "raidserve", LONGEST) for m in (llama, mixtral)] == [3, 5]
    assert [minimum_devices(m, H100, "nonuniform", LONGEST) for m in (llama, mixtral)] == [3, 5]

    def used(model: ModelSpec, mode: str) -> list[int | None]:
        out: list[int | None] = []
        for n in range(1, 9):
            layout = plan_layout(model, n, mode)  # type: ignore[arg-type]
            out.append(layout.ranks if layout.fits(H100, LONGEST) else None)
        return out

    assert used(llama, "standard") == [None, None, None, 4, 4, 4, 4, 8]
    assert used(mixtral, "standard") == [None] * 7 + [8]
    assert used(llama, "raidserve") == [None, None, 3, 4, 5, 6, 7, 8]


def test_seven_of_eight_h100s_balance_with_raidserve_and_not_without() -> None:
    llama = load_model("Llama-3.1-70B-Instruct")
    naive, cyclic, raid = (
        plan_layout(llama, 7, "nonuniform"),
        plan_layout(llama, 7, "nonuniform", cyclic=True),
        plan_layout(llama, 7, "raidserve"),
    )
    assert naive.imbalance()["kv"] == pytest.approx(1.75) and naive.imbalance()["attention"] == pytest.approx(
        1.75
    )
    assert cyclic.imbalance()["kv"] < 1.01 and cyclic.imbalance()["attention"] == pytest.approx(1.75)
    assert raid.imbalance()["attention"] == pytest.approx(1.0) and raid.imbalance()["kv"] < 1.05
    assert raid.max_batch_tokens(H100) > 1.6 * naive.max_batch_tokens(H100)
    assert (raid.tp_heads, raid.replicated) == (tuple((h,) for h in range(7)), (7,))


def test_unknown_modes_and_no_devices_are_refused() -> None:
    llama = load_model("Llama-3.1-70B-Instruct")
    with pytest.raises(ConfigError):
        plan_layout(llama, 0, "raidserve")
    with pytest.raises(ConfigError):
        plan_layout(llama, 4, "magic")  # type: ignore[arg-type]


def test_recovery_from_tp8_keeps_every_surviving_shard_and_beats_recompute() -> None:
    """The paper's setting (section 3.2): Llama-3.1-70B on 8 H100s, 56 requests of 16K tokens, one GPU lost."""
    llama = load_model("Llama-3.1-70B-Instruct")
    before = plan_layout(llama, 8, "raidserve")
    plan = plan_recovery(before, 3, H100, [16384] * 56)
    assert plan.after.devices == (0, 1, 2, 4, 5, 6, 7) and plan.after.replicated == (3,)
    for kept, r in zip(plan.ffn_kept, (0, 1, 2, 4, 5, 6, 7), strict=True):
        assert kept == before.ffn[r]
    assert sorted(s for x in plan.ffn_loaded for s in x) == list(before.ffn[3])
    assert max(len(x) for x in plan.ffn_loaded) - min(len(x) for x in plan.ffn_loaded) <= 1
    # Each survivor reads about (35 + 17.5) / 7 = 7.5 GB over PCIe (the paper's estimate) and recovers in < 0.2 s.
    pcie = [t.pcie for t in plan.on_demand]
    assert all(6e9 < p < 9e9 for p in pcie)
    assert plan.times["full"] < 0.2 < plan.times["host"] < 1.0 < 20 < plan.times["recompute"]
    assert all(
        t.ffn_pcie + t.attention_pcie <= w for t, w in zip(plan.on_demand, plan.naive_weights, strict=True)
    )


@settings(max_examples=60, deadline=None)
@given(models(), st.integers(2, 8), st.data())
def test_any_recovery_places_everything_on_the_survivors(
    model: ModelSpec, n: int, data: st.DataObject
) -> None:
    before = plan_layout(model, n, "raidserve")
    lost = data.draw(st.sampled_from(before.devices))
    tokens = data.draw(st.lists(st.integers(0, 4096), max_size=6))
    plan = plan_recovery(before, lost, H100, tokens)
    after = plan.after
    assert lost not in after.devices and after.ranks == n - 1
    assert sorted(s for group in after.ffn for s in group) == list(range(before.n_shards))
    for layer in range(model.num_layers):
        tp = [h for r in range(after.ranks) for h in after.heads_at(r, layer)]
        assert sorted(tp + list(after.replicated)) == list(range(model.num_kv_heads))
    assert len({len(g) for g in after.tp_heads}) == 1  # hybrid attention: equal tensor-parallel work
    lost_kv = sum(t.kv_pcie for t in plan.on_demand)
    held = sum(
        tok * before.kv_bytes_per_token(before.devices.index(lost), k % before.ranks)
        for k, tok in enumerate(tokens)
    )
    assert lost_kv == pytest.approx(held)  # exactly what the lost device held comes back from the backup
