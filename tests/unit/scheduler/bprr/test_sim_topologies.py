"""Synthetic stand-ins for Table 3's networks: published counts and delay ranges, RTTs over delay-shortest paths."""

from __future__ import annotations

import numpy as np
import pytest

from opentela.scheduler.bprr.topologies import (
    TABLE3,
    TopologySpec,
    shortest_delays,
    synthesize,
    table3_topology,
)


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_stand_in_has_the_published_statistics(name: str) -> None:
    spec = TABLE3[name]
    topo = table3_topology(name)
    assert topo.n_nodes == spec.n_nodes
    assert topo.n_links == spec.n_links  # directed links, as Table 3 counts them
    assert len({(u, v) for u, v, _ in topo.edges}) == spec.n_links // 2  # no duplicate links
    assert all(u < v for u, v, _ in topo.edges)
    delays = topo.delays()
    assert delays.min() == pytest.approx(spec.min_delay_s) and delays.max() == pytest.approx(spec.max_delay_s)
    assert np.all((delays >= spec.min_delay_s - 1e-15) & (delays <= spec.max_delay_s + 1e-15))


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_rtts_are_twice_the_delay_shortest_paths(name: str) -> None:
    topo = table3_topology(name)
    rtt = topo.rtt_s
    assert np.all(np.isfinite(rtt)), "the graph must be connected"
    assert np.allclose(rtt, rtt.T) and np.all(np.diag(rtt) == 0)
    for u, v, d in topo.edges:
        assert rtt[u, v] <= 2 * d + 1e-15  # never longer than the direct link
    # Triangle inequality: no detour through a third node is shorter.
    assert (
        np.all(rtt[:, :, None] <= rtt[:, None, :] + rtt.T[None, :, :] + 1e-12) if topo.n_nodes < 60 else True
    )
    # A path's RTT is at least twice the smallest link delay and at most twice the sum of all delays.
    off = rtt[~np.eye(topo.n_nodes, dtype=bool)]
    assert off.min() >= 2 * topo.spec.min_delay_s - 1e-15
    assert off.max() <= 2 * topo.delays().sum()


def test_shortest_delays_picks_the_cheaper_detour() -> None:
    d = shortest_delays(3, ((0, 1, 1.0), (1, 2, 1.0), (0, 2, 5.0)))
    assert d[0, 2] == 2.0 and d[2, 0] == 2.0 and d[0, 0] == 0.0


def test_synthesis_is_seeded() -> None:
    spec = TopologySpec("toy", 12, 30, 0.001, 0.01)
    a, b, c = synthesize(spec, 1), synthesize(spec, 1), synthesize(spec, 2)
    assert a.edges == b.edges and np.array_equal(a.rtt_s, b.rtt_s)
    assert a.edges != c.edges


def test_impossible_link_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        synthesize(TopologySpec("sparse", 10, 8, 0.001, 0.01))  # 4 links cannot connect 10 nodes
    with pytest.raises(ValueError):
        synthesize(TopologySpec("dense", 4, 14, 0.001, 0.01))  # 7 > 6 possible links
