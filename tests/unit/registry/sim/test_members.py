"""SWIM over a shared roster behaves as SWIM over its own dict: same targets, helpers, suspicions, evictions."""

from __future__ import annotations

import random

from opentela.registry.sim.members import FastShuffle, TrackedSwim
from opentela.registry.swim import Member, Status, SwimState, Update


def test_a_roster_backed_member_table_answers_as_a_plain_one() -> None:
    sessions = [f"s{i}" for i in range(40)]
    roster = {s: f"n{i % 30}" for i, s in enumerate(sessions)}  # some nodes hold two sessions
    plain = SwimState("s0", suspicion_timeout=5.0, rng=random.Random(3))
    plain.sync(roster)
    shared = TrackedSwim("s0", suspicion_timeout=5.0, retransmit_mult=3, rng=random.Random(3))
    shared.use_roster(roster)
    ops = random.Random(9)
    now = 0.0
    for step in range(400):
        now += 0.1
        kind = ops.randrange(5)
        session = ops.choice(sessions[1:])
        if kind == 0:
            a, b = plain.next_target(), shared.next_target()
            assert (a and a.session) == (b and b.session), step
        elif kind == 1:
            assert plain.probe_failed(session, now) == shared.probe_failed(session, now)
        elif kind == 2:
            update = Update(Status(ops.randrange(2)), session, ops.randrange(3))
            assert plain.apply(update, now) == shared.apply(update, now)
        elif kind == 3 and ops.random() < 0.2:
            plain.remove(session)
            shared.remove(session)
        elif kind == 4:
            target = plain.members.get(session)
            if target is not None:
                a_help = [m.session for m in plain.helpers(target, 3)]
                b_help = [m.session for m in shared.helpers(shared.members[session], 3)]
                assert a_help == b_help, step
        assert len(plain.members) == len(shared.members) and set(plain.members) == set(shared.members)
        assert {m.session for m in plain.suspected()} == {m.session for m in shared.suspected()}
        assert {m.session for m in plain.due_evictions(now)} == {m.session for m in shared.due_evictions(now)}
        assert plain.piggyback("s1", 6) == shared.piggyback("s1", 6)
    # A session added back after its removal is a member again, with what it is told from then on.
    shared.members["s1"] = Member("s1", "n1")
    assert "s1" in shared.members and shared.members["s1"].status is Status.ALIVE


def test_probing_among_neighbours_is_a_round_robin_over_them() -> None:
    # With `among`, the real method sees only those members (a different order before its shuffle than a plain
    # table would give it, so the same distribution, not the same sequence): each is probed once per round.
    roster = {f"s{i}": f"n{i}" for i in range(1000)}
    swim = TrackedSwim("s0", suspicion_timeout=5.0, retransmit_mult=3, rng=random.Random(4))
    swim.use_roster(roster)
    among = {"s3", "s70", "s512", "s999", "s0", "nope"}  # our own session and strangers are never targets
    for _ in range(5):
        picked = [swim.next_target(among) for _ in range(4)]
        assert sorted(m.session for m in picked if m is not None) == ["s3", "s512", "s70", "s999"]
    target = swim.members["s3"]
    assert {m.session for m in swim.helpers(target, 3, among)} <= {"s70", "s512", "s999"}
    assert len(swim.members) == 999


def test_fast_shuffle_is_a_permutation_and_deterministic() -> None:
    items = list(range(500))
    a, b = list(items), list(items)
    FastShuffle(5).shuffle(a)
    FastShuffle(5).shuffle(b)
    assert a == b and sorted(a) == items and a != items
