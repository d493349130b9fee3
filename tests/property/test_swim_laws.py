"""SWIM's laws over generated news: the order of arrival is moot, incarnations only grow, refutation wins."""

from __future__ import annotations

import random

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from opentela.registry.swim import Status, SwimState, Update

SESSIONS = ["me", "a", "b", "c"]

updates = st.builds(
    Update, st.sampled_from(list(Status)), st.sampled_from(SESSIONS), st.integers(min_value=0, max_value=5)
)


def fresh() -> SwimState:
    swim = SwimState("me", suspicion_timeout=5.0, rng=random.Random(0))
    swim.sync({s: f"peer-{s}" for s in SESSIONS})
    return swim


def beliefs(swim: SwimState) -> dict[str, tuple[int, int]]:
    out = {s: m.precedence for s, m in swim.members.items()}
    out["me"] = (swim.incarnation, 0)
    return out


@given(st.lists(updates, max_size=12), st.randoms())
def test_any_delivery_order_gives_the_same_beliefs(news: list[Update], rnd: random.Random) -> None:
    a, b = fresh(), fresh()
    for u in news:
        a.apply(u, now=0.0)
    shuffled = list(news)
    rnd.shuffle(shuffled)
    for u in shuffled:
        b.apply(u, now=0.0)
    others = {s: v for s, v in beliefs(a).items() if s != "me"}
    assert others == {s: v for s, v in beliefs(b).items() if s != "me"}
    # Our own incarnation ends above every suspicion of us, whatever the order.
    worst = max((u.incarnation for u in news if u.session == "me" and u.status is Status.SUSPECT), default=-1)
    assert a.incarnation == b.incarnation == worst + 1


@given(st.lists(updates, max_size=12))
def test_beliefs_are_the_maximum_precedence_heard(news: list[Update]) -> None:
    swim = fresh()
    for u in news:
        swim.apply(u, now=0.0)
    for session in SESSIONS[1:]:
        heard = [u.precedence for u in news if u.session == session]
        assert swim.members[session].precedence == max(heard, default=(0, 0))


@given(st.lists(updates, max_size=16))
def test_incarnations_only_grow(news: list[Update]) -> None:
    swim = fresh()
    last = beliefs(swim)
    for u in news:
        swim.apply(u, now=0.0)
        now = beliefs(swim)
        assert all(now[s][0] >= last[s][0] for s in SESSIONS)
        assert all(now[s] >= last[s] for s in SESSIONS if s != "me")
        last = now


@given(st.integers(0, 50))
def test_a_refutation_overrides_the_suspicion_everywhere(incarnation: int) -> None:
    target, observer = SwimState("a", suspicion_timeout=5.0), fresh()
    target.incarnation = incarnation
    suspicion = Update(Status.SUSPECT, "a", incarnation)
    observer.apply(suspicion, now=0.0)
    target.apply(suspicion, now=0.0)
    (refutation,) = [u for u in target.piggyback(None, 8) if u.session == "a"]
    observer.apply(refutation, now=1.0)
    assert not observer.is_suspected("a")
    assert not observer.apply(suspicion, now=2.0), "the old suspicion cannot come back"


@given(
    st.builds(
        Update, st.sampled_from(list(Status)), st.text(min_size=1, max_size=128), st.integers(0, 2**62 - 1)
    )
)
def test_updates_round_trip_through_msgpack(update: Update) -> None:
    assert Update.from_wire(msgpack.unpackb(msgpack.packb(update.to_wire()))) == update


@given(
    st.one_of(st.none(), st.integers(), st.text(), st.lists(st.one_of(st.integers(), st.text(), st.none())))
)
def test_arbitrary_input_parses_or_raises_value_error(obj: object) -> None:
    try:
        Update.from_wire(obj)
    except ValueError:
        pass
