"""Message sizes and byte accounting: the simulator's sizes are what the real encoders produce."""

from __future__ import annotations

import random
import uuid

import msgpack
import pytest

from opentela.fabric.messages import encode_msg
from opentela.registry.sim.events import EventLoop
from opentela.registry.sim.network import PROBE, LinkModel, Network
from opentela.registry.sim.wire import WireSizes, view_batch, view_message


@pytest.fixture(scope="module")
def sizes() -> WireSizes:
    return WireSizes.measure()


def test_probe_messages_match_hand_computed_sizes(sizes: WireSizes) -> None:
    # {"p": <32-char session>}: fixmap(1) + "p"(2) + str8 header(2) + 32, and the u32 length: 41 bytes, as
    # docs/registry.md says; {"a": 0} is 8. TLS 1.3 adds 5 + 1 + 16 to each record.
    assert sizes.ping[0] == 41 and sizes.ack[0] == 8
    assert sizes.tls_overhead == 22
    assert sizes.syn_probe == 12 + 1 + len("/otela/probe/1")
    assert sizes.rst_cancel == 12 + 4 + len("stream closed before the end of its data")
    # Each update [status, session, incarnation] adds 1 + 1 + 34 + 1 bytes; the "u" key and list header 3.
    assert sizes.ping[1] == 41 + 2 + 1 + 37 and sizes.ping[2] == sizes.ping[1] + 37
    initiator, responder = sizes.probe(sizes.ping[0], sizes.ack[0])
    assert initiator == 22 + 12 + 15 + 41
    assert responder == 22 + 12 + 8 + sizes.rst_cancel


def test_digest_want_and_records_match_msgpack(sizes: WireSizes) -> None:
    sessions = [uuid.uuid4().hex for _ in range(300)]
    for n in (0, 1, 15, 16, 300):
        digest = {"t": "digest", "d": {s: [1, 3] for s in sessions[:n]}, "l": 1}
        assert sizes.digest(n) == len(encode_msg(digest))
        assert sizes.want(n) == len(encode_msg({"t": "want", "k": sessions[:n]}))
    record = {"x": "y" * 1500}
    one = len(msgpack.packb(record))
    for count in (1, 5, 256, 300):
        chunks = [list(range(i, min(count, i + 256))) for i in range(0, count, 256)]
        real = sum(len(encode_msg({"t": "recs", "r": [record] * len(c)})) + 12 for c in chunks)
        assert sizes.records_message(one * count, count, 256) == real


def test_lazy_push_and_shard_messages_match_msgpack(sizes: WireSizes) -> None:
    sessions = [uuid.uuid4().hex for _ in range(40)]
    for n in (1, 15, 16, 40):
        ids = [[s, 1, 7] for s in sessions[:n]]
        body = sizes.framed(len(encode_msg({"t": "push", "i": ids})))
        assert sizes.push(0, 0, 256, ids=n)[0] == sizes.push(0, 0, 256)[0] + body - 12 + 12
        assert sizes.graft(n) == sizes.flight(
            sizes.syn_gossip + len(encode_msg({"t": "graft", "k": sessions[:n]}))
        )
    assert sizes.prune == len(encode_msg({"t": "push", "x": 1}))
    for classes in (4, 62, 200):
        hashes = [bytes(8)] * classes
        assert sizes.sums(classes) == len(encode_msg({"t": "sums", "k": 200, "h": hashes, "l": 1}))
        asked = list(range(0, classes, 3))
        assert sizes.shards(asked) == len(encode_msg({"t": "shards", "s": asked}))


def test_overlay_messages_match_msgpack(sizes: WireSizes) -> None:
    peer, addrs = sizes.example_peer, sizes.example_addrs
    walk = {"t": "forward_join", "p": peer, "a": list(addrs), "ttl": 6}
    assert view_message(peer, addrs, "forward_join", True, 6, False, 0) == len(msgpack.packb(walk))
    shuffle = {"t": "shuffle", "p": peer, "a": list(addrs), "ttl": 6, "s": [peer] * 8}
    size = view_message(peer, addrs, "shuffle", True, 6, False, 8)
    assert size == len(msgpack.packb(shuffle))
    assert view_batch([size, size]) == len(encode_msg({"m": [shuffle, shuffle]}))


def test_records_weigh_a_few_kilobytes_and_tombstones_less(sizes: WireSizes) -> None:
    join, serving, down, left = sizes.record
    assert 500 < join < serving < 4096 and left < join and down >= serving - 8


def test_network_counts_each_byte_at_both_ends(sizes: WireSizes) -> None:
    loop = EventLoop()
    net = Network(
        loop,
        sizes,
        LinkModel(latency=(0.01, 0.01), bandwidth=0),
        random.Random(1),
        keepalive_interval=15.0,
        keepalive_timeout=10.0,
    )
    a, b = net.add_node(), net.add_node()
    got: list[float] = []
    assert net.send(a, b, 100, PROBE, lambda: got.append(loop.now))
    handshake = sizes.handshake_dialer + sizes.handshake_listener
    assert net.sent[a] == 100 + sizes.handshake_dialer and net.recv[b] == 100 + sizes.handshake_dialer
    assert net.sent[b] == sizes.handshake_listener and net.recv[a] == sizes.handshake_listener
    loop.run_until(1.0)
    assert got == [pytest.approx(0.01 * 9)]  # four round trips of handshake, then one way
    # 40 silent seconds: two keepalive intervals, in each both ends PING and answer the other's.
    loop.run_until(41.0)
    net.settle()
    assert net.sent[a] + net.recv[a] == pytest.approx(100 + handshake + 2 * 4 * sizes.keepalive)
    assert net.open_connections(a) == net.open_connections(b) == 1


def star(sizes: WireSizes, link: LinkModel) -> tuple[EventLoop, Network, int, list[int]]:
    """A sender connected to three receivers, one simulated second after the dials."""
    loop = EventLoop()
    net = Network(loop, sizes, link, random.Random(1), keepalive_interval=15.0, keepalive_timeout=10.0)
    sender, *receivers = (net.add_node() for _ in range(4))
    for r in receivers:
        net.connect(sender, r)
    loop.run_until(1.0)
    return loop, net, sender, receivers


def handled_at(sizes: WireSizes, link: LinkModel, targets: list[int]) -> list[tuple[int, float]]:
    """The star's sender sends one message to each of `targets` (receivers by position), in order, at once:
    (receiver, seconds until its handler ran) in the order they ran."""
    loop, net, sender, receivers = star(sizes, link)
    handled: list[tuple[int, float]] = []
    for t in targets:
        net.send(sender, receivers[t], 100, PROBE, lambda t=t: handled.append((t, round(loop.now - 1.0, 6))))
    loop.run_until(2.0)
    return handled


@pytest.mark.parametrize("cores", [0, 1, 2])
def test_nodes_on_shared_cores_queue_for_them(sizes: WireSizes, cores: int) -> None:
    # Three nodes each get one message at the same instant, each costing 10 ms of processing. On cores of their
    # own, all three are handled at once (what a handler sends is held until its work is done); on shared cores a
    # handler runs when its work is done: one core, one after the other; two cores, two at once, then the third.
    link = LinkModel(latency=(0.0, 0.0), bandwidth=0, cpu_per_message=0.01, cores=cores)
    handled = [at for _, at in handled_at(sizes, link, [0, 1, 2])]
    assert handled == {0: [0.0, 0.0, 0.0], 1: [0.01, 0.02, 0.03], 2: [0.01, 0.01, 0.02]}[cores]


def test_shared_cores_take_turns_between_nodes_not_messages(sizes: WireSizes) -> None:
    # One shared core: the first receiver gets three messages, the second one message just after them. The
    # nodes take turns, a message each, as processes do under the operating system's scheduler: the second
    # node's message is handled after the first node's first, not after all three.
    link = LinkModel(latency=(0.0, 0.0), bandwidth=0, cpu_per_message=0.01, cores=1)
    busy, quiet = 0, 1
    handled = handled_at(sizes, link, [busy, busy, busy, quiet])
    assert handled == [(busy, 0.01), (quiet, 0.02), (busy, 0.03), (busy, 0.04)]


@pytest.mark.parametrize(
    ("slice_s", "order"),
    [
        (0.015, [(0, 0.01), (0, 0.02), (1, 0.03), (0, 0.04)]),  # its slice ends after two: the other's turn
        (0.025, [(0, 0.01), (0, 0.02), (0, 0.03), (1, 0.04)]),  # all three within its slice
    ],
)
def test_a_node_keeps_its_core_for_its_time_slice(
    sizes: WireSizes, slice_s: float, order: list[tuple[int, float]]
) -> None:
    # As above, but a node that has the core works through its queue until its slice is used up (a process
    # keeps its core until it blocks or its slice ends), so the quiet node waits for more than one message.
    link = LinkModel(latency=(0.0, 0.0), bandwidth=0, cpu_per_message=0.01, cores=1, cpu_slice=slice_s)
    assert handled_at(sizes, link, [0, 0, 0, 1]) == order


@pytest.mark.parametrize("cores", [0, 2])
def test_a_node_writes_its_messages_one_after_another(sizes: WireSizes, cores: int) -> None:
    # Sending costs the sender 10 ms a message (receiving is free here): three messages sent at once leave one
    # after another, 10, 20 and 30 ms later.
    link = LinkModel(latency=(0.0, 0.0), bandwidth=0, cpu_per_send=0.01, cores=cores)
    arrived = [at for _, at in handled_at(sizes, link, [0, 1, 2])]
    assert arrived == [0.01, 0.02, 0.03]
