"""The joiner's split first sync: which neighbour is asked for which part of the registry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.registry.join_sync import JoinSync, shard_of


def test_shard_of_is_stable_and_in_range() -> None:
    keys = [f"session-{i}" for i in range(600)]
    shards = [shard_of(k, 6) for k in keys]
    assert all(0 <= s < 6 for s in shards)
    assert shards == [shard_of(k, 6) for k in keys]
    # Roughly even: every class gets a fair share of 600 keys.
    assert min(shards.count(s) for s in range(6)) > 60
    assert shard_of("anything", 1) == 0


def test_each_new_neighbour_gets_one_part_and_the_contact_none_before_the_wait() -> None:
    plan = JoinSync(shards=3, wait=1.0, contacts=frozenset({"boot"}))
    assert plan.on_neighbour("boot", now=0.0) == ()
    assert plan.on_neighbour("a", now=0.1) == (0,)
    assert plan.on_neighbour("b", now=0.2) == (1,)
    assert plan.on_neighbour("a", now=0.3) == ()  # already pulling
    plan.finished("a", ok=True)
    plan.finished("b", ok=True)
    assert not plan.complete
    # After the wait the last part goes to an idle non-contact before the contact.
    assert plan.reassign(["boot", "a", "b"], now=0.5) == {}
    assert plan.reassign(["boot", "a", "b"], now=1.0) == {"a": (2,)}
    plan.finished("a", ok=True)
    assert plan.complete


def test_a_lone_contact_serves_everything_after_the_wait() -> None:
    plan = JoinSync(shards=4, wait=1.0, contacts=frozenset({"boot"}))
    assert plan.on_neighbour("boot", now=0.0) == ()
    assert plan.reassign(["boot"], now=1.0) == {"boot": (0, 1, 2, 3)}
    plan.finished("boot", ok=True)
    assert plan.complete


def test_a_failed_pull_returns_its_part() -> None:
    plan = JoinSync(shards=2, wait=1.0)
    assert plan.on_neighbour("a", now=0.0) == (0,)
    assert plan.on_neighbour("b", now=0.0) == (1,)
    plan.finished("b", ok=False)
    assert plan.todo == {1}
    assert plan.reassign(["a", "b"], now=2.0) == {}  # a is busy, and b failed: wait for a
    plan.finished("a", ok=True)
    assert plan.reassign(["a", "b"], now=3.0) == {"a": (1,)}
    plan.finished("a", ok=True)
    assert plan.complete
    # A peer that failed is asked again when nobody else is there.
    lone = JoinSync(shards=1, wait=0.0)
    lone.on_neighbour("b", now=0.0)
    lone.finished("b", ok=False)
    assert lone.reassign(["b"], now=1.0) == {"b": (0,)}


events = st.lists(
    st.tuples(
        st.sampled_from(["up", "ok", "fail", "reassign"]),
        st.sampled_from(["boot", "a", "b", "c"]),
        st.floats(min_value=0.0, max_value=0.5),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(shards=st.integers(1, 8), steps=events)
def test_parts_are_never_pulled_twice_at_once_and_all_arrive(shards: int, steps: list) -> None:
    plan = JoinSync(shards=shards, wait=1.0, contacts=frozenset({"boot"}))
    now = 0.0
    for kind, peer, dt in steps:
        now += dt
        if kind == "up":
            got = plan.on_neighbour(peer, now)
            if peer == "boot" and not plan.expired(now):
                assert got == ()
        elif kind in ("ok", "fail"):
            plan.finished(peer, ok=kind == "ok")
        else:
            plan.reassign(["boot", "a", "b", "c"], now)
        pulled = [s for shards_ in plan.pulling.values() for s in shards_]
        assert len(pulled) == len(set(pulled))  # no part asked of two peers at once
        assert not set(pulled) & plan.todo and not set(pulled) & plan.done
        assert plan.todo | plan.done | set(pulled) == set(range(shards))  # nothing lost
    # However it went, once a neighbour is up, finishing every pull and reassigning after the wait completes
    # the sync.
    plan.on_neighbour("a", now)
    now += 2.0
    for _ in range(shards + 1):
        for peer in list(plan.pulling):
            plan.finished(peer, ok=True)
        plan.reassign(["a"], now)
    for peer in list(plan.pulling):
        plan.finished(peer, ok=True)
    assert plan.complete
