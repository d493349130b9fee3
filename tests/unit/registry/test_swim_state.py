"""The SWIM state machine without sockets or an event loop: the clock is a number passed in."""

from __future__ import annotations

import random

import pytest

from opentela.registry.swim import Member, Status, SwimState, Update

TIMEOUT = 10.0


def state(session: str = "me", members: dict[str, str] | None = None) -> SwimState:
    swim = SwimState(session, suspicion_timeout=TIMEOUT, retransmit_mult=2, rng=random.Random(7))
    swim.sync(members if members is not None else {"a": "peer-a", "b": "peer-b", "c": "peer-c", "me": "self"})
    return swim


def test_sync_follows_the_live_sessions_and_skips_our_own() -> None:
    swim = state()
    assert set(swim.members) == {"a", "b", "c"}
    swim.members["a"].incarnation = 4
    swim.sync({"a": "peer-a", "d": "peer-d"})
    assert set(swim.members) == {"a", "d"} and swim.members["a"].incarnation == 4


def test_round_robin_probes_everyone_once_per_round() -> None:
    swim = state()
    for _ in range(5):
        picked = [swim.next_target() for _ in range(3)]
        assert sorted(m.session for m in picked if m) == ["a", "b", "c"]
    assert state(members={}).next_target() is None


def test_a_member_that_joins_mid_round_is_probed_in_that_round_at_a_random_place() -> None:
    # Appended to the next round instead, a newcomer of a 40-member mesh could go 40 periods unprobed.
    places = []
    for seed in range(200):
        members = {f"m{i}": f"peer-{i}" for i in range(40)}
        swim = SwimState("me", suspicion_timeout=TIMEOUT, rng=random.Random(seed))
        swim.sync(members)
        first = [swim.next_target() for _ in range(10)]
        swim.sync({**members, "new": "peer-new"})
        rest = [swim.next_target() for _ in range(31)]
        picked = [m.session for m in first + rest if m is not None]
        assert sorted(picked) == sorted([*members, "new"])  # everyone once, the newcomer included
        places.append(picked.index("new") - 10)
    # Uniform over the 31 places left in the round, not always last.
    assert min(places) == 0 and max(places) == 30 and 10 < sum(places) / len(places) < 20


def test_a_session_that_enters_the_probed_set_mid_round_joins_that_round() -> None:
    swim = state(members={f"m{i}": f"peer-{i}" for i in range(6)})
    among = {"m0", "m1", "m2", "m3"}
    first = [swim.next_target(among) for _ in range(2)]
    among |= {"m5"}  # a new neighbour
    rest = [swim.next_target(among) for _ in range(3)]
    picked = [m.session for m in first + rest if m is not None]
    assert sorted(picked) == ["m0", "m1", "m2", "m3", "m5"]


def test_helpers_are_other_unsuspected_nodes() -> None:
    swim = state(members={"a": "p1", "a2": "p1", "b": "p2", "c": "p3", "d": "p4"})
    swim.probe_failed("d", now=0.0)
    helpers = swim.helpers(swim.members["a"], 3)
    assert {h.peer for h in helpers} == {"p2", "p3"}, "never the target's own node, never a suspected one"
    assert swim.helpers(swim.members["a"], 1)[0].peer in {"p2", "p3"}


def test_failed_probe_suspects_then_evicts_after_the_grace_period() -> None:
    swim = state()
    changes: list[tuple[str, Status]] = []
    swim.on_change(lambda m: changes.append((m.session, m.status)))
    assert swim.probe_failed("a", now=100.0)
    assert swim.is_suspected("a") and changes == [("a", Status.SUSPECT)]
    assert not swim.probe_failed("a", now=105.0), "a second failure changes nothing (the clock keeps running)"
    assert swim.due_evictions(100.0 + TIMEOUT - 0.1) == []
    assert [m.session for m in swim.due_evictions(100.0 + TIMEOUT)] == ["a"]


def test_hearsay_suspicion_waits_twice_as_long_so_the_witness_evicts_first() -> None:
    swim = state()
    assert swim.apply(Update(Status.SUSPECT, "b", 0), now=0.0)
    assert swim.is_suspected("b") and not swim.members["b"].witnessed
    assert swim.due_evictions(TIMEOUT) == []
    assert [m.session for m in swim.due_evictions(2 * TIMEOUT)] == ["b"]


def test_only_a_higher_incarnation_lifts_a_suspicion() -> None:
    swim = state()
    swim.probe_failed("a", now=0.0)
    assert not swim.acked("a", 0, now=1.0), "an answer at the suspected incarnation does not refute"
    assert not swim.apply(Update(Status.ALIVE, "a", 0), now=1.0)
    assert swim.is_suspected("a")
    assert swim.acked("a", 1, now=2.0)
    assert not swim.is_suspected("a") and swim.due_evictions(1000.0) == []
    # A stale suspicion (of the old incarnation) arriving late changes nothing.
    assert not swim.apply(Update(Status.SUSPECT, "a", 0), now=3.0)
    assert swim.apply(Update(Status.SUSPECT, "a", 1), now=3.0)


def test_a_suspected_node_refutes_by_raising_its_incarnation() -> None:
    swim = state()
    assert swim.apply(Update(Status.SUSPECT, "me", 0), now=0.0)
    assert swim.incarnation == 1 and swim.refutations == 1
    assert Update(Status.ALIVE, "me", 1) in swim.piggyback("a", limit=8)
    assert not swim.apply(Update(Status.SUSPECT, "me", 0), now=1.0), "an old suspicion is already refuted"
    assert swim.apply(Update(Status.SUSPECT, "me", 5), now=1.0) and swim.incarnation == 6


def test_news_spreads_a_bounded_number_of_times() -> None:
    swim = state()
    swim.probe_failed("a", now=0.0)
    carried = 0
    for _ in range(50):
        if Update(Status.SUSPECT, "a", 0) in swim.piggyback("b", limit=8):
            carried += 1
    # retransmit_mult x ceil(log2(N + 1)) with N = 4 nodes: 2 x 3.
    assert carried == 6 and swim.pending_news() == 0
    assert swim.piggyback("b", limit=8) == [], "an idle mesh sends no membership news"


def test_the_suspected_node_always_hears_of_its_suspicion() -> None:
    swim = state()
    swim.probe_failed("a", now=0.0)
    for _ in range(50):
        swim.piggyback("b", limit=8)
    assert swim.piggyback("a", limit=8) == [Update(Status.SUSPECT, "a", 0)]


def test_piggyback_respects_the_limit_and_prefers_fresh_news() -> None:
    swim = state(members={f"s{i}": f"p{i}" for i in range(10)})
    for i in range(10):
        swim.probe_failed(f"s{i}", now=0.0)
    first = swim.piggyback(None, limit=3)
    assert len(first) == 3
    second = swim.piggyback(None, limit=3)
    assert not set(first) & set(second), "news sent fewer times goes first"


def test_unknown_sessions_are_ignored_and_restart_resets() -> None:
    swim = state()
    assert not swim.apply(Update(Status.SUSPECT, "zzz", 3), now=0.0)
    swim.apply(Update(Status.SUSPECT, "me", 2), now=0.0)
    swim.restart("me-2")
    assert swim.session == "me-2" and swim.incarnation == 0 and swim.pending_news() == 0


@pytest.mark.parametrize(
    "wire",
    [
        [1, "s", -1],
        [2, "s", 0],
        [True, "s", 0],
        [0, "", 0],
        [0, "s"],
        "x",
        [0, 5, 0],
        [0, "s", 2**63],
        [0, "s", 1.5],
    ],
)
def test_malformed_updates_are_refused(wire: object) -> None:
    with pytest.raises(ValueError):
        Update.from_wire(wire)


def test_update_round_trips() -> None:
    update = Update(Status.SUSPECT, "abc", 7)
    assert Update.from_wire(update.to_wire()) == update
    assert Member("s", "p").precedence == (0, 0)
