"""Anti-entropy by shards: class hashes tell exactly which classes of two digests differ."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.registry.digest_shards import MAX_SHARDS, SUMS_MIN_KEYS, differing, shard_count, shard_hashes
from opentela.registry.join_sync import shard_of


def test_small_registries_send_the_whole_digest_and_large_ones_a_bounded_number_of_classes() -> None:
    assert shard_count(SUMS_MIN_KEYS - 1) == 0
    assert shard_count(SUMS_MIN_KEYS) >= 4
    assert shard_count(1000) == 62
    assert shard_count(10**6) == MAX_SHARDS


ranks = st.tuples(st.integers(0, 3), st.integers(0, 2**40))
digests = st.dictionaries(st.text(min_size=1, max_size=12), ranks, max_size=80)


@settings(max_examples=200, deadline=None)
@given(
    ours=digests,
    edits=st.dictionaries(st.text(min_size=1, max_size=12), ranks, max_size=6),
    count=st.integers(1, 40),
)
def test_the_classes_that_differ_are_exactly_those_holding_a_key_the_digests_disagree_on(
    ours: dict[str, tuple[int, int]], edits: dict[str, tuple[int, int]], count: int
) -> None:
    theirs = {**ours, **edits}
    disagree = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    got = differing(shard_hashes(ours, count), shard_hashes(theirs, count))
    assert set(got) == {shard_of(k, count) for k in disagree}
    # Order does not matter, and lists and tuples hash alike (a digest off the wire holds lists).
    assert shard_hashes(dict(reversed(list(ours.items()))), count) == shard_hashes(ours, count)
    assert shard_hashes({k: list(v) for k, v in ours.items()}, count) == shard_hashes(ours, count)
