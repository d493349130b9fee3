"""The partial view's state machine in an in-process message-passing harness: invariants, symmetry, repair."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.registry.partial_view import Kind, PartialView, Send, ViewMessage


@dataclass
class Net:
    """Nodes and the messages between them, delivered in order per (sender, receiver), as one connection would."""

    views: dict[str, PartialView]
    rng: random.Random
    dead: set[str] = field(default_factory=set)
    queues: dict[tuple[str, str], deque[ViewMessage]] = field(default_factory=dict)
    busy: list[tuple[str, str]] = field(default_factory=list)  # pairs with messages in flight
    sent: int = 0

    @classmethod
    def create(cls, n: int, seed: int, **kw: int) -> Net:
        views = {
            f"p{i:03d}": PartialView(f"p{i:03d}", rng=random.Random(seed * 1000 + i), **kw) for i in range(n)
        }
        return cls(views, random.Random(seed))

    @property
    def live(self) -> list[str]:
        return [p for p in self.views if p not in self.dead]

    def post(self, sender: str, sends: list[Send]) -> None:
        work = [(sender, sends)]
        while work:
            src, batch = work.pop()
            for dst, msg in batch:
                self.sent += 1
                if dst in self.dead:
                    # The connection is refused: the sender learns at once.
                    if src not in self.dead:
                        work.append((src, self.views[src].failed(dst)))
                    continue
                queue = self.queues.setdefault((src, dst), deque())
                if not queue:
                    self.busy.append((src, dst))
                queue.append(msg)

    def deliver(self, steps: int) -> None:
        for _ in range(steps):
            if not self.busy:
                return
            i = self.rng.randrange(len(self.busy))
            src, dst = pair = self.busy[i]
            queue = self.queues[pair]
            msg = queue.popleft()
            if not queue:
                self.busy[i] = self.busy[-1]
                self.busy.pop()
            if dst in self.dead:
                if src not in self.dead:
                    self.post(src, self.views[src].failed(dst))
                continue
            self.post(dst, self.views[dst].receive(src, msg))

    def quiesce(self, limit: int = 500_000) -> None:
        self.deliver(limit)
        assert not self.busy, "messages still in flight after the step limit"

    def join(self, node: str, contact: str) -> None:
        self.post(node, self.views[node].join(contact))

    def tick(self, node: str) -> None:
        self.post(node, self.views[node].tick())

    def crash(self, node: str) -> None:
        self.dead.add(node)
        for peer in self.live:
            if self.views[peer].is_active(node):
                self.post(peer, self.views[peer].failed(node))  # its connection broke

    def offer_everyone(self) -> None:
        """What the driver does from the registry: every live member is offered (used while there is room)."""
        live = self.live
        for peer in live:
            self.post(peer, self.views[peer].offer([p for p in live if p != peer]))

    def rounds(self, n: int, *, offers: bool = False) -> None:
        for _ in range(n):
            if offers:
                self.offer_everyone()
            for peer in self.live:
                self.tick(peer)
            self.quiesce()

    def check_invariants(self) -> None:
        for me, view in self.views.items():
            active, passive = set(view.active), set(view.passive)
            assert me not in active and me not in passive
            assert len(view.active) == len(active) <= view.active_max
            assert len(view.passive) == len(passive) <= view.passive_max
            assert not active & passive

    def check_symmetric(self) -> None:
        for me in self.live:
            for peer in self.views[me].active:
                assert peer not in self.dead, f"{me} keeps dead {peer} as a neighbour"
                assert self.views[peer].is_active(me), f"{me} holds {peer}, not the other way round"

    def components(self) -> list[set[str]]:
        seen: set[str] = set()
        out = []
        for start in self.live:
            if start in seen:
                continue
            comp, todo = {start}, [start]
            while todo:
                for peer in self.views[todo.pop()].active:
                    if peer not in comp and peer not in self.dead:
                        comp.add(peer)
                        todo.append(peer)
            seen |= comp
            out.append(comp)
        return out


ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.integers(0, 15), st.integers(0, 15)),
        st.tuples(st.just("tick"), st.integers(0, 15), st.just(0)),
        st.tuples(st.just("deliver"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("crash"), st.integers(0, 15), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 16),
    active_max=st.integers(2, 5),
    passive_max=st.integers(0, 8),
    seed=st.integers(0, 2**16),
    script=ops,
)
def test_views_stay_well_formed_and_symmetric_under_any_schedule(
    n: int, active_max: int, passive_max: int, seed: int, script: list[tuple[str, int, int]]
) -> None:
    net = Net.create(n, seed, active_max=active_max, passive_max=passive_max, active_walk=4, passive_walk=2)
    names = list(net.views)
    joined = {names[0]}
    for op, a, b in script:
        node, other = names[a % n], names[b % n]
        if op == "join" and node not in net.dead and node not in joined and other in joined:
            if other not in net.dead:
                net.join(node, other)
                joined.add(node)
        elif op == "tick" and node not in net.dead:
            net.tick(node)
        elif op == "deliver":
            net.deliver(a)
        elif op == "crash" and node != names[0] and node in joined:
            net.crash(node)
        net.check_invariants()
    net.quiesce()
    net.check_invariants()
    net.check_symmetric()
    for _ in range(2):
        net.rounds(1)
        net.check_invariants()
        net.check_symmetric()
    # A node alone knows nobody it could ask: any candidate left would have been asked with high priority.
    for peer in net.live:
        view = net.views[peer]
        assert view.active or not view.passive, f"{peer} is alone with candidates {view.passive}"


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 14), active_max=st.integers(2, 6), seed=st.integers(0, 2**16), order=st.randoms())
def test_every_node_that_joins_gets_a_neighbour(
    n: int, active_max: int, seed: int, order: random.Random
) -> None:
    net = Net.create(n, seed, active_max=active_max, passive_max=6, active_walk=5, passive_walk=2)
    names = list(net.views)
    joined = [names[0]]
    for node in names[1:]:
        net.join(node, order.choice(joined))  # joins overlap: messages of earlier ones may still be in flight
        joined.append(node)
        net.deliver(order.randrange(0, 30))
    net.quiesce()
    net.check_symmetric()
    assert all(net.views[p].active for p in names), "a node that joined is alone"


@settings(max_examples=150, deadline=None)
@given(
    extra=st.integers(0, 1),
    active_max=st.integers(2, 6),
    seed=st.integers(0, 2**16),
    crashes=st.integers(0, 3),
)
def test_a_small_mesh_is_a_full_mesh_even_after_failures(
    extra: int, active_max: int, seed: int, crashes: int
) -> None:
    """With N <= active_max + 1 every node is every other's neighbour, as before partial views."""
    n = active_max + extra
    net = Net.create(n, seed, active_max=active_max, passive_max=8)
    names = list(net.views)
    for node in names[1:]:
        net.join(node, names[0])
    net.quiesce()
    net.rounds(2, offers=True)
    for node in names[1 : 1 + min(crashes, n - 1)]:
        net.crash(node)
    net.rounds(3, offers=True)
    net.check_symmetric()
    live = net.live
    for peer in live:
        assert set(net.views[peer].active) == set(live) - {peer}


@pytest.mark.parametrize("seed", range(6))
def test_a_large_overlay_stays_connected_when_a_fifth_of_it_fails(seed: int) -> None:
    net = Net.create(300, seed)  # the defaults: 6 active, 30 passive, walks of 6 and 3
    names = list(net.views)
    rng = random.Random(seed)
    for i, node in enumerate(names[1:], start=1):
        net.join(node, names[rng.randrange(0, i)])
        net.deliver(rng.randrange(0, 50))
    net.quiesce()
    net.rounds(5)
    net.check_symmetric()
    assert len(net.components()) == 1
    degrees = [len(net.views[p].active) for p in names]
    assert max(degrees) <= 6 and sum(degrees) / len(degrees) >= 4.5
    for node in rng.sample(names, len(names) // 5):
        net.crash(node)
    net.rounds(3)
    net.check_symmetric()
    assert len(net.components()) == 1, "the survivors' active views are one graph"
    assert all(net.views[p].active for p in net.live)


def test_the_same_seed_gives_the_same_views() -> None:
    def run() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        net = Net.create(40, 7, active_max=4, passive_max=10)
        names = list(net.views)
        for i, node in enumerate(names[1:], start=1):
            net.join(node, names[(i * 7) % i])
            net.deliver(5)
        net.quiesce()
        net.rounds(3)
        return [(v.active, v.passive) for v in net.views.values()]

    assert run() == run()


def test_forward_join_walks_end_in_active_views_and_leave_passive_copies() -> None:
    net = Net.create(30, 3, active_max=5, passive_max=30, active_walk=6, passive_walk=3)
    names = list(net.views)
    for node in names[1:-1]:
        net.join(node, names[0])
        net.quiesce()
    net.rounds(3)
    newcomer = names[-1]
    before = net.sent
    net.join(newcomer, names[5])
    net.quiesce()
    view = net.views[newcomer]
    assert names[5] in view.active or len(view.active) >= 2
    assert len(view.active) >= 2, "the walks found more neighbours than the contact"
    assert sum(newcomer in net.views[p].passive for p in names) >= 1, "a walk left it in a passive view"
    assert net.sent - before < 60, "a join costs a few dozen messages, not one per node"


def test_a_neighbour_request_is_refused_when_full_unless_high() -> None:
    view = PartialView("me", active_max=2, passive_max=4, rng=random.Random(1))
    view.receive("a", ViewMessage(Kind.CONNECT))
    view.receive("b", ViewMessage(Kind.CONNECT))
    assert set(view.active) == {"a", "b"}
    assert view.receive("c", ViewMessage(Kind.NEIGHBOR)) == [("c", ViewMessage(Kind.REFUSE))]
    assert "c" in view.passive
    out = view.receive("d", ViewMessage(Kind.NEIGHBOR, high=True))
    assert "d" in view.active and len(view.active) == 2
    dropped = [peer for peer, msg in out if msg.kind is Kind.DISCONNECT]
    assert len(dropped) == 1 and dropped[0] in view.passive
    assert ("d", ViewMessage(Kind.CONNECT)) in out


def test_an_unsolicited_connect_to_a_full_view_is_answered_with_disconnect() -> None:
    view = PartialView("me", active_max=2, passive_max=4, rng=random.Random(1))
    view.receive("a", ViewMessage(Kind.CONNECT))
    view.receive("b", ViewMessage(Kind.CONNECT))
    assert view.receive("c", ViewMessage(Kind.CONNECT)) == [("c", ViewMessage(Kind.DISCONNECT))]
    assert view.active == ("a", "b") and "c" in view.passive


def test_a_failed_neighbour_is_replaced_from_the_passive_view() -> None:
    view = PartialView("me", active_max=2, passive_max=4, rng=random.Random(2))
    view.receive("a", ViewMessage(Kind.CONNECT))
    view.offer(["x", "y"])
    out = view.failed("a")
    assert view.active == () and "a" in view.passive
    asked = [(p, m) for p, m in out if m.kind is Kind.NEIGHBOR]
    assert len(asked) == 1 and asked[0][1].high, "alone: one request that must be accepted"
    # A second failure of the same peer (the repair could not reach it either) drops it for good.
    view.failed("a")
    assert "a" not in view.passive
    view.offer(["a"])
    assert "a" not in view.passive, "a peer that just failed is not taken back from offers"


def test_shuffle_swaps_samples_through_a_walk() -> None:
    net = Net.create(12, 5, active_max=3, passive_max=4)
    names = list(net.views)
    for node in names[1:]:
        net.join(node, names[0])
        net.quiesce()
    known_before = {p: set(net.views[p].passive) for p in names}
    net.rounds(4)
    changed = sum(set(net.views[p].passive) != known_before[p] for p in names)
    assert changed >= len(names) // 2
    net.check_symmetric()
