"""Lazy push: eager and lazy neighbours, prunes, grafts, and that every node still gets every record."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.registry.lazy_push import PRUNE_REPEAT, LazyPush


def state(*neighbours: str, capable: bool = True) -> LazyPush[str, str, int]:
    lazy: LazyPush[str, str, int] = LazyPush(graft_timeout=0.5, retry_timeout=0.25)
    for peer in neighbours:
        lazy.neighbour_up(peer)
        if capable:
            lazy.learned(peer)
    return lazy


def test_links_start_eager_and_a_duplicate_prunes_once() -> None:
    lazy = state("a", "b")
    assert not lazy.is_lazy("a") and not lazy.is_lazy("b")
    assert lazy.received("a", fresh=True, now=0.0) is False
    assert lazy.received("b", fresh=False, now=0.0) is True  # nothing new from b: tell it to prune
    assert lazy.is_lazy("b")
    assert lazy.received("b", fresh=False, now=1.0) is False  # already told
    assert lazy.received("b", fresh=False, now=1.0 + PRUNE_REPEAT) is True  # it keeps pushing: tell it again
    assert lazy.received("b", fresh=True, now=10.0) is False and not lazy.is_lazy("b")  # news: eager again


def test_a_peer_that_never_said_it_understands_ids_is_never_made_lazy() -> None:
    lazy = state("old", capable=False)
    assert lazy.received("old", fresh=False, now=0.0) is False
    lazy.pruned("stranger")  # not a neighbour: nothing to prune
    assert not lazy.is_lazy("old") and not lazy.lazy
    # Learning from a non-neighbour (a passive anti-entropy partner) records nothing either.
    lazy.learned("stranger")
    assert lazy.capable == set()


def test_prune_and_graft_received() -> None:
    lazy = state("a")
    lazy.pruned("a")
    assert lazy.is_lazy("a")
    lazy.grafted("a")
    assert not lazy.is_lazy("a")


def test_an_announced_record_that_does_not_come_is_grafted_from_each_announcer_in_turn() -> None:
    lazy = state("a", "b", "c")
    lazy.pruned("a")
    assert lazy.announced("a", "k", 5, ours=3, now=0.0) is True
    assert lazy.announced("b", "k", 5, ours=3, now=0.1) is False  # the same wait, a second announcer
    assert lazy.announced("c", "held", 2, ours=2, now=0.1) is False  # we hold it: nothing to wait for
    assert lazy.next_due() == 0.5
    assert lazy.due(0.4) == {}
    assert lazy.due(0.5) == {"a": ["k"]}
    assert not lazy.is_lazy("a")  # grafting makes the link eager again
    assert lazy.due(0.6) == {}
    assert lazy.due(0.75) == {"b": ["k"]}
    assert lazy.due(1.0) == {}  # nobody left to ask: the wait is dropped (anti-entropy repairs)
    assert lazy.missing == {}


def test_the_record_arriving_ends_the_wait_and_a_newer_id_extends_it() -> None:
    lazy = state("a", "b")
    lazy.announced("a", "k", 5, ours=None, now=0.0)
    lazy.announced("b", "k", 7, ours=None, now=0.1)
    lazy.arrived("k", 5)  # older than the newest announced: keep waiting
    assert "k" in lazy.missing
    lazy.arrived("k", 7)
    assert lazy.missing == {} and lazy.next_due() is None


def test_an_announcer_that_left_the_view_is_skipped_and_forgotten() -> None:
    lazy = state("a", "b")
    lazy.pruned("a")
    lazy.announced("a", "k", 1, ours=None, now=0.0)
    lazy.announced("b", "k", 1, ours=None, now=0.0)
    lazy.neighbour_down("a")
    assert "a" not in lazy.capable and not lazy.is_lazy("a")
    assert lazy.due(1.0) == {"b": ["k"]}


def test_losing_a_tree_link_turns_every_other_link_eager_again() -> None:
    lazy = state("tree", "a", "b", "c")
    lazy.pruned("a")
    lazy.pruned("b")
    # A lazy link going changes nothing: records never took it.
    assert lazy.neighbour_down("b") == []
    assert lazy.lazy == {"a"}
    # An eager one may have been the tree's only way here: a and c get records again, and a (the lazy one) is
    # returned, to be asked for records too.
    assert lazy.neighbour_down("tree") == ["a"]
    assert lazy.lazy == set() and lazy.counters["reeagered"] == 1
    # Nothing lazy left: nothing to ask.
    assert lazy.neighbour_down("c") == []


def test_the_waits_are_bounded() -> None:
    lazy: LazyPush[str, int, int] = LazyPush(max_missing=3)
    lazy.neighbour_up("a")
    started = [lazy.announced("a", k, 1, ours=None, now=0.0) for k in range(5)]
    assert started == [True, True, True, False, False]


def test_a_node_that_does_not_prune_still_honours_prunes() -> None:
    lazy: LazyPush[str, str, int] = LazyPush(prune=False)
    lazy.neighbour_up("a")
    lazy.learned("a")
    assert lazy.received("a", fresh=False, now=0.0) is False
    lazy.pruned("a")
    assert lazy.is_lazy("a")


# --- a whole mesh, messages delivered in random order ---------------------------------------------------------
class Mesh:
    """Nodes on a graph running LazyPush; some are older nodes that only flood records and ignore the rest."""

    def __init__(
        self, edges: set[tuple[int, int]], n: int, old: set[int], rng: random.Random, fifo: bool = False
    ) -> None:
        self.n, self.old, self.rng, self.fifo = n, old, rng, fifo
        self.adj: dict[int, set[int]] = {i: set() for i in range(n)}
        for a, b in edges:
            self.adj[a].add(b)
            self.adj[b].add(a)
        self.lazy: dict[int, LazyPush[int, int, int]] = {}
        for i in range(n):
            self.lazy[i] = LazyPush(graft_timeout=0.5, retry_timeout=0.25)
            for j in self.adj[i]:
                self.lazy[i].neighbour_up(j)
                if j not in old:  # an older node never says it understands ids
                    self.lazy[i].learned(j)
        self.replica: list[dict[int, int]] = [{} for _ in range(n)]
        self.grafts_with_keys = 0
        self.queue: list[tuple[str, int, int, object]] = []  # (kind, sender, receiver, payload)
        self.now = 0.0
        self.records_sent = 0

    def write(self, node: int, key: int, rank: int) -> None:
        self.replica[node][key] = rank
        self.forward(node, key, rank, source=None)

    def forward(self, node: int, key: int, rank: int, source: int | None) -> None:
        for peer in self.adj[node]:
            if peer == source:
                continue
            if node not in self.old and self.lazy[node].is_lazy(peer):
                self.queue.append(("ids", node, peer, (key, rank)))
            else:
                self.records_sent += 1
                self.queue.append(("push", node, peer, (key, rank)))

    def apply(self, node: int, key: int, rank: int, sender: int) -> bool:
        fresh = self.replica[node].get(key, -1) < rank
        if fresh:
            self.replica[node][key] = rank
            self.forward(node, key, rank, source=sender)
        if node not in self.old:
            self.lazy[node].arrived(key, rank)
        return fresh

    def step(self) -> None:
        # In order of sending, a link delay apart (every link equally fast), or in any order at all.
        kind, sender, node, payload = self.queue.pop(0 if self.fifo else self.rng.randrange(len(self.queue)))
        self.now += 0.001 if self.fifo else self.rng.uniform(0.0, 0.05)
        if node in self.old:
            # An older node takes records and nothing else (it is never sent the rest).
            assert kind == "push", "an older node was sent something it does not understand"
            assert isinstance(payload, tuple)
            self.apply(node, payload[0], payload[1], sender)
            return
        lazy = self.lazy[node]
        if kind == "push":
            assert isinstance(payload, tuple)
            fresh = self.apply(node, payload[0], payload[1], sender)
            if lazy.received(sender, fresh, self.now):
                self.queue.append(("prune", node, sender, None))
        elif kind == "ids":
            assert isinstance(payload, tuple)
            lazy.announced(sender, payload[0], payload[1], self.replica[node].get(payload[0]), self.now)
        elif kind == "prune":
            lazy.pruned(sender)
        elif kind == "graft":
            lazy.grafted(sender)
            assert isinstance(payload, list)
            self.grafts_with_keys += bool(payload)
            for key in payload:
                if key in self.replica[node]:
                    self.records_sent += 1
                    self.queue.append(("push", node, sender, (key, self.replica[node][key])))
        self.fire_grafts()

    def fire_grafts(self) -> None:
        for i in range(self.n):
            if i not in self.old:
                for peer, keys in self.lazy[i].due(self.now).items():
                    self.queue.append(("graft", i, peer, keys))

    def cut(self, a: int, b: int) -> None:
        """The link a-b leaves both active views; each end asks what `neighbour_down` says to ask."""
        self.adj[a].discard(b)
        self.adj[b].discard(a)
        for node, gone in ((a, b), (b, a)):
            for peer in self.lazy[node].neighbour_down(gone):
                self.queue.append(("graft", node, peer, []))

    def run(self) -> None:
        while True:
            while self.queue:
                self.step()
            due = [d for i, lz in self.lazy.items() if i not in self.old and (d := lz.next_due()) is not None]
            if not due:
                return
            self.now = max(self.now, min(due))
            self.fire_grafts()


def random_graph(n: int, degree: int, rng: random.Random) -> set[tuple[int, int]]:
    """A ring (so it is connected) plus random chords."""
    edges = {(i, (i + 1) % n) for i in range(n)}
    for i in range(n):
        for _ in range(degree - 2):
            j = rng.randrange(n)
            if j != i:
                edges.add((min(i, j), max(i, j)))
    return {(a, b) for a, b in edges if a != b}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(3, 24),
    seed=st.integers(0, 2**32 - 1),
    old_share=st.sampled_from([0.0, 0.0, 0.3, 1.0]),
    writes=st.integers(1, 12),
)
def test_every_node_gets_every_record_in_any_delivery_order(
    n: int, seed: int, old_share: float, writes: int
) -> None:
    rng = random.Random(seed)
    old = {i for i in range(n) if rng.random() < old_share}
    mesh = Mesh(random_graph(n, 4, rng), n, old, rng)
    truth: dict[int, int] = {}
    for _ in range(writes):
        key = rng.randrange(4)
        truth[key] = truth.get(key, 0) + 1
        writer = rng.randrange(n)
        mesh.write(writer, key, truth[key])
        # Deliver some of it before the next write, so writes overlap.
        for _ in range(rng.randrange(len(mesh.queue) + 1)):
            mesh.step()
    mesh.run()
    for i in range(n):
        assert mesh.replica[i] == truth, f"node {i} of {n} missed a record"
        lazy = mesh.lazy[i]
        assert lazy.lazy <= lazy.capable <= lazy.neighbours
        assert not (lazy.capable & old)


def test_after_a_few_changes_records_take_a_tree_instead_of_every_link() -> None:
    n = 60
    edges = random_graph(n, 6, random.Random(7))
    flood = Mesh(edges, n, old=set(range(n)), rng=random.Random(1), fifo=True)
    tree = Mesh(edges, n, old=set(), rng=random.Random(1), fifo=True)
    for mesh in (flood, tree):
        rng = random.Random(3)
        for key in range(10):  # warm up: the first changes prune the redundant links
            mesh.write(rng.randrange(n), key, 1)
            mesh.run()
        mesh.records_sent = 0
        for key in range(10, 30):
            mesh.write(rng.randrange(n), key, 1)
            mesh.run()
    for mesh in (flood, tree):
        assert all(len(r) == 30 for r in mesh.replica)
    # Flooding sends each record over each link about once each way; the tree about once per node.
    assert flood.records_sent > 2.5 * 20 * n
    assert tree.records_sent < 1.6 * 20 * n


def test_a_record_after_tree_links_are_cut_needs_no_graft() -> None:
    # View changes (a join, a failure) take links out of active views. Where a link of the tree goes, the
    # tree falls in two, and without repair the next record would reach the far side only as ids, each node
    # there waiting out the graft timeout before asking.
    n = 60
    edges = random_graph(n, 6, random.Random(7))
    mesh = Mesh(edges, n, old=set(), rng=random.Random(1), fifo=True)
    rng = random.Random(3)
    for key in range(10):  # the first changes prune the redundant links
        mesh.write(rng.randrange(n), key, 1)
        mesh.run()
    tree = sorted((a, b) for a, b in edges if not mesh.lazy[a].is_lazy(b) and not mesh.lazy[b].is_lazy(a))
    for a, b in rng.sample(tree, 6):
        mesh.cut(a, b)
    mesh.run()  # the repair asks (grafts naming no key) are delivered
    for key in range(10, 15):
        mesh.write(rng.randrange(n), key, 1)
        mesh.run()
    assert all(len(r) == 15 for r in mesh.replica)
    assert mesh.grafts_with_keys == 0
