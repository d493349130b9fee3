"""Synthetic stand-ins for the Internet Topology Zoo networks of Sun et al.'s Table 3, and RTTs over them.

The paper simulates AboveNet, BellCanada and GTS-CE with link delays from Repetita. Those files are not shipped
here, so each network is synthesized (seeded) to the statistics the paper publishes: the node count, the link
count (Repetita lists every link once per direction, so 62 links are 31 undirected links used both ways), 1 Gbit/s
capacities and the range of link delays. Nodes are dropped uniformly on a plane and joined by a Euclidean minimum
spanning tree plus Waxman-style short links, as backbones are; link delays are the link lengths mapped affinely
onto the published [min, max]. RTTs are twice the cumulative delay along delay-shortest paths, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class TopologySpec:
    """The published statistics of one Topology Zoo network (Table 3)."""

    name: str
    n_nodes: int
    n_links: int
    """Directed links, as Repetita counts them (twice the undirected links)."""
    min_delay_s: float
    max_delay_s: float
    capacity_bps: float = 1e9


TABLE3: dict[str, TopologySpec] = {
    "AboveNet": TopologySpec("AboveNet", 23, 62, 0.100e-3, 13.800e-3),
    "BellCanada": TopologySpec("BellCanada", 48, 130, 0.078e-3, 6.160e-3),
    "GTS-CE": TopologySpec("GTS-CE", 149, 386, 0.005e-3, 1.081e-3),
}
"""Table 3 of the paper: nodes, links, 1 Gbit/s capacities and the link-delay range."""


@dataclass(frozen=True)
class Topology:
    """An undirected network: links with one-way delays, and the all-pairs RTT matrix derived from them."""

    spec: TopologySpec
    edges: tuple[tuple[int, int, float], ...]
    """(u, v, one-way delay in seconds), u < v."""
    rtt_s: np.ndarray
    """RTT between every pair of nodes: twice the delay-shortest path (seconds)."""

    @property
    def n_nodes(self) -> int:
        """Nodes in the graph."""
        return self.spec.n_nodes

    @property
    def n_links(self) -> int:
        """Directed links (each undirected link counted both ways, as Table 3)."""
        return 2 * len(self.edges)

    def delays(self) -> np.ndarray:
        """One-way delays of the undirected links (seconds)."""
        return np.array([d for _, _, d in self.edges])


def _mst(dist: np.ndarray) -> list[tuple[int, int]]:
    """Prim's algorithm on a dense distance matrix: the n - 1 links of a minimum spanning tree."""
    n = len(dist)
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    best = dist[0].copy()
    parent = np.zeros(n, dtype=int)
    edges = []
    for _ in range(n - 1):
        candidates = np.where(in_tree, np.inf, best)
        v = int(np.argmin(candidates))
        edges.append((min(v, int(parent[v])), max(v, int(parent[v]))))
        in_tree[v] = True
        closer = dist[v] < best
        best = np.where(closer, dist[v], best)
        parent = np.where(closer, v, parent)
    return edges


def shortest_delays(n_nodes: int, edges: tuple[tuple[int, int, float], ...]) -> np.ndarray:
    """All-pairs delay-shortest path lengths (Floyd-Warshall; the graphs have at most a few hundred nodes)."""
    d = np.full((n_nodes, n_nodes), np.inf)
    np.fill_diagonal(d, 0.0)
    for u, v, w in edges:
        d[u, v] = d[v, u] = min(d[u, v], w)
    for k in range(n_nodes):
        d = np.minimum(d, d[:, k, None] + d[None, k, :])
    return d


def synthesize(spec: TopologySpec, seed: int = 0) -> Topology:
    """A connected graph with `spec`'s node count, link count and exact link-delay range."""
    undirected = spec.n_links // 2
    if not spec.n_nodes - 1 <= undirected <= spec.n_nodes * (spec.n_nodes - 1) // 2:
        raise ValueError(f"{spec.name}: {undirected} links cannot connect {spec.n_nodes} nodes simply")
    rng = np.random.default_rng(seed)
    points = rng.random((spec.n_nodes, 2))
    dist = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    chosen = set(_mst(dist))
    # Extra links: Waxman's rule, short links far likelier than long ones (backbones are mostly local meshes).
    iu, ju = np.triu_indices(spec.n_nodes, k=1)
    free = np.array([(i, j) not in chosen for i, j in zip(iu.tolist(), ju.tolist(), strict=True)])
    weights = np.exp(-dist[iu, ju] / (0.15 * dist.max())) * free
    extra = undirected - len(chosen)
    if extra:
        picks = rng.choice(len(iu), size=extra, replace=False, p=weights / weights.sum())
        chosen.update((int(iu[k]), int(ju[k])) for k in picks)
    links = sorted(chosen)
    lengths = np.array([dist[u, v] for u, v in links])
    lo, hi = lengths.min(), lengths.max()
    scale = (spec.max_delay_s - spec.min_delay_s) / (hi - lo) if hi > lo else 0.0
    edges = tuple(
        (u, v, float(spec.min_delay_s + (length - lo) * scale))
        for (u, v), length in zip(links, lengths, strict=True)
    )
    return Topology(spec, edges, 2 * shortest_delays(spec.n_nodes, edges))


@cache
def table3_topology(name: str, seed: int = 0) -> Topology:
    """The synthetic stand-in for one of Table 3's networks (cached: the benchmark reuses it every run)."""
    return synthesize(TABLE3[name], seed)
