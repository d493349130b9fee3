"""RaidServe's placement rules as the engine applies them: every unit placed once, survivors keep what they hold,
and cyclic placement spreads the replicated heads' caches evenly."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela.engines.tp.placement import Placement


@st.composite
def placements(draw: st.DrawFn) -> tuple[Placement, int, int]:
    n_kv = draw(st.integers(1, 16))
    n_shards = draw(st.integers(1, 24))
    ranks = draw(st.integers(1, 8))
    ids = tuple(sorted(draw(st.sets(st.integers(0, 63), min_size=ranks, max_size=ranks))))
    return Placement.initial(ids, n_kv, n_shards), n_kv, n_shards


def assert_complete(p: Placement, n_kv: int, n_shards: int) -> None:
    tp = Counter(h for heads in p.tp_heads for h in heads)
    assert all(count == 1 for count in tp.values())
    assert set(tp).isdisjoint(p.replicated)
    assert set(tp) | set(p.replicated) == set(range(n_kv))
    shards = Counter(s for group in p.ffn for s in group)
    assert sorted(shards) == list(range(n_shards)) and set(shards.values()) == {1}
    # Tensor-parallel heads are even over ranks; what does not divide is replicated (hybrid attention).
    assert len({len(h) for h in p.tp_heads}) == 1
    assert len(p.replicated) == n_kv - len(p.tp_heads[0]) * p.degree


@given(placements())
def test_initial_placement_places_every_unit_once(case: tuple[Placement, int, int]) -> None:
    assert_complete(*case)


@given(placements(), st.data())
def test_losses_keep_what_survivors_hold(case: tuple[Placement, int, int], data: st.DataObject) -> None:
    p, n_kv, n_shards = case
    while p.degree > 1:
        lost = data.draw(st.sampled_from(p.ranks))
        after = p.without(lost, n_kv)
        assert after.ranks == tuple(r for r in p.ranks if r != lost)
        assert_complete(after, n_kv, n_shards)
        for worker in after.ranks:
            before_shards = set(p.ffn[p.position(worker)])
            assert before_shards <= set(after.ffn[after.position(worker)])  # no FFN shard is given up
            kept = set(p.tp_heads[p.position(worker)]) & set(after.tp_heads[after.position(worker)])
            assert len(kept) == min(len(p.tp_heads[p.position(worker)]), len(after.tp_heads[0]))
        p = after


@given(placements(), st.integers(0, 7), st.integers(1, 40))
def test_every_head_of_every_layer_has_one_computing_owner(
    case: tuple[Placement, int, int], base: int, layers: int
) -> None:
    p, n_kv, _ = case
    for layer in range(layers):
        computed = Counter(h for w in p.ranks for h in p.computes(w, layer, base))
        assert computed == Counter(range(n_kv))
        for head in range(n_kv):
            assert head in p.computes(p.owner(head, layer, base), layer, base)


@given(placements(), st.integers(0, 7))
def test_cyclic_placement_evens_replicated_caches_over_any_degree_consecutive_layers(
    case: tuple[Placement, int, int], base: int
) -> None:
    p, _, _ = case
    if not p.replicated:
        return
    for start in range(3):
        owners = Counter(p.dp_owner(base, layer) for layer in range(start, start + p.degree))
        assert set(owners.values()) == {1}


def test_smollm2_on_two_ranks_is_non_uniform_with_one_replicated_head() -> None:
    p = Placement.initial((0, 1), 3, 6)
    assert (p.tp_heads, p.replicated, p.ffn) == (((0,), (1,)), (2,), ((0, 1, 2), (3, 4, 5)))
    after = Placement.initial((0, 1, 2), 3, 6).without(1, 3)
    assert (after.ranks, after.tp_heads, after.replicated) == ((0, 2), ((0,), (2,)), (1,))
    assert after.ffn == ((0, 1, 2), (4, 5, 3))
    with pytest.raises(ValueError):
        Placement((0,), (), (), ())
