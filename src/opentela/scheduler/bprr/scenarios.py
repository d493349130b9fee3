"""The evaluation settings of Sun et al. (Section 4.1) as data: BLOOM-176B, A100 and MIG servers, Tables 2 and 3.

Where the numbers come from:

- Paper: 70 blocks, l_max^I = 20, l_max in {64, 128}, s_c per Eq. (2); PETALS places 53 blocks on an A100 and 4
  on a MIG (Section 4.2.1), which only fits 4-bit blocks, so s_m is BLOOM's 2.47e9 parameters per block in NF4
  (4.25 bits with its scales) plus 1 % overhead; Table 2's RTTs and bandwidths; "sending one embedding across two
  clusters takes about 0.12 s", which fixes the per-hop serialization overhead of the clustered setting.
- The paper prints no per-block times or effective memories. Those below are the measured values of the authors'
  published MATLAB simulator (LLM_inference_simulator): tau, tau^I(l^I) = a l^I + b, M_j, PETALS' measured
  forward/network throughputs, the scattered setting's 100 ms per-token and (0.7049 l^I + 67) ms per-input
  overheads, and the per-session constants (70 ms start, 60 s / 250 s cache allocation) that `calibrated_setup`
  returns. `roofline_block_times` gives our own catalog's estimate beside them for comparison; it is not used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from opentela.scheduler.bprr.problem import Instance, ModelSpec, Network, ServerSpec
from opentela.scheduler.bprr.topologies import Topology, table3_topology

L_BLOCKS = 70
D_MODEL = 14336
PARAMS_PER_BLOCK = 2_466_437_120  # 12 d^2 + 13 d: attention, 4d MLP, biases and norms
NF4_BYTES = 4.25 / 8
INPUT_LEN = 20
GIB = 1024**3
PETALS_RESERVE_BYTES = 2 * GIB
"""PETALS keeps 2 GiB per BLOOM-176B server for autograd before sizing its blocks."""


@dataclass(frozen=True)
class GpuKind:
    """One server type: memory, per-block times (tau^I at l^I = 20) and PETALS' own throughput measurements."""

    name: str
    memory_bytes: int
    tau_decode_s: float
    tau_prefill_s: float
    forward_rps: float
    network_rps: float

    def server(self, label: str) -> ServerSpec:
        """A ServerSpec of this kind."""
        return ServerSpec(label, self.memory_bytes, self.tau_decode_s, self.tau_prefill_s, gpu=self.name)


A100 = GpuKind("A100-80G", 80 * GIB, 3.2197e-3, (0.0743 * INPUT_LEN + 32.99) * 1e-3, 20829.4, 3020.4)
"""A100 80 GB: 80 GiB of device memory (PETALS then places 53 blocks, as the paper reports)."""
MIG = GpuKind(
    "A100-MIG-1g.10gb", 9_100_000_000, 16.2488e-3, (0.1041 * INPUT_LEN + 206.3547) * 1e-3, 2757.7, 3138.1
)
"""One seventh of an A100 (MIG 1g.10gb): 9.1 GB effective memory, 4 PETALS blocks."""

CLUSTER_RTT_S = ((0.005, 0.100, 0.100), (0.100, 0.005, 0.100), (0.100, 0.100, 0.005))
CLUSTER_BW_BPS = ((1e9, 1e8, 1e8), (1e8, 1e9, 1e8), (1e8, 1e8, 1e9))
"""Table 2: RTT and bandwidth between Cluster0 (clients), Cluster1 (2 A100s) and Cluster2 (7 MIGs)."""
SCATTERED_TOKEN_OVERHEAD_S = 0.100
SCATTERED_INPUT_OVERHEAD_S = (0.7049 * INPUT_LEN + 67) * 1e-3


def bloom176b(output_len: int = 128, input_len: int = INPUT_LEN) -> ModelSpec:
    """BLOOM-176B as the planner sees it: 70 NF4 blocks, 2 d_model fp16 KV values per token and block."""
    return ModelSpec(
        "BLOOM-176B",
        L_BLOCKS,
        round(PARAMS_PER_BLOCK * NF4_BYTES * 1.01),
        2 * D_MODEL * 2,
        input_len=input_len,
        output_len=output_len,
        token_bytes=D_MODEL * 2,
    )


def clustered_overhead_s(model: ModelSpec) -> float:
    """Serialization per hop such that one inter-cluster embedding round trip takes the paper's 0.12 s."""
    transfer = 2 * model.token_bytes * 8 / CLUSTER_BW_BPS[0][1]
    return 0.12 - CLUSTER_RTT_S[0][1] - transfer


@dataclass(frozen=True)
class Scenario:
    """One deployment: the planner's instance (one client), raw pings for PETALS' router, server kinds."""

    name: str
    instance: Instance
    kinds: tuple[GpuKind, ...]
    client_ping_s: tuple[float, ...]
    """Raw RTT from the client to each server (what PETALS measures with ping)."""
    server_ping_s: tuple[tuple[float, ...], ...]
    """Raw RTT between servers."""

    @property
    def n_servers(self) -> int:
        """Servers in the deployment."""
        return len(self.kinds)

    def with_output_len(self, output_len: int) -> Scenario:
        """The same deployment serving requests of `output_len` tokens (s_c changes, times do not)."""
        model = replace(self.instance.model, output_len=output_len)
        return replace(self, instance=replace(self.instance, model=model))


def _network(
    ping: Sequence[float], bw: Sequence[float], model: ModelSpec, token_over: float, input_over: float
) -> Network:
    """Per-token and per-input RTTs: ping, the embeddings' transfer both ways, and a fixed overhead."""
    token = tuple(p + 2 * model.token_bytes * 8 / b + token_over for p, b in zip(ping, bw, strict=True))
    inp = tuple(
        p + 2 * model.input_len * model.token_bytes * 8 / b + input_over
        for p, b in zip(ping, bw, strict=True)
    )
    return Network((token,), (inp,))


def clustered(client_cluster: int, output_len: int = 128) -> Scenario:
    """Table 2: a client in Cluster0/1/2; servers 0-1 are the A100s (Cluster1), 2-8 the MIGs (Cluster2)."""
    model = bloom176b(output_len)
    kinds = (A100,) * 2 + (MIG,) * 7
    where = (1,) * 2 + (2,) * 7
    ping = [CLUSTER_RTT_S[client_cluster][w] for w in where]
    bw = [CLUSTER_BW_BPS[client_cluster][w] for w in where]
    overhead = clustered_overhead_s(model)
    network = _network(ping, bw, model, overhead, overhead)
    servers = tuple(k.server(f"{k.name}-{j}") for j, k in enumerate(kinds))
    instance = Instance(model, servers, (f"cluster{client_cluster}",), network, (1,))
    pings = tuple(tuple(CLUSTER_RTT_S[a][b] for b in where) for a in where)
    return Scenario(f"Cluster{client_cluster}", instance, kinds, tuple(ping), pings)


def scattered(
    topology: Topology | str,
    n_servers: int,
    eta: float,
    rng: np.random.Generator,
    output_len: int = 128,
) -> Scenario:
    """Section 4.1: C random server nodes, round(eta C) of them A100s, one client at another random node."""
    topo = table3_topology(topology) if isinstance(topology, str) else topology
    if n_servers + 1 > topo.n_nodes:
        raise ValueError(
            f"{topo.spec.name} has {topo.n_nodes} nodes: no room for {n_servers} servers + 1 client"
        )
    model = bloom176b(output_len)
    nodes = rng.permutation(topo.n_nodes)
    client, hosts = int(nodes[0]), [int(v) for v in nodes[1 : n_servers + 1]]
    n_a100 = math.floor(eta * n_servers + 0.5)  # half up, not Python's half-to-even: eta 0.5 of 9 is 5
    kinds = tuple(A100 if i < n_a100 else MIG for i in rng.permutation(n_servers))
    ping = [float(topo.rtt_s[client, h]) for h in hosts]
    bw = [topo.spec.capacity_bps] * n_servers
    network = _network(ping, bw, model, SCATTERED_TOKEN_OVERHEAD_S, SCATTERED_INPUT_OVERHEAD_S)
    servers = tuple(k.server(f"{k.name}@{h}") for k, h in zip(kinds, hosts, strict=True))
    instance = Instance(model, servers, (f"node{client}",), network, (1,))
    pings = tuple(tuple(float(topo.rtt_s[a, b]) for b in hosts) for a in hosts)
    return Scenario(topo.spec.name, instance, kinds, tuple(ping), pings)


PAPER_SERVERS = {"AboveNet": 9, "BellCanada": 26, "GTS-CE": 26}
"""C in Tables 4-5: the smaller deployment (9 GPUs) on AboveNet, the larger one (26 GPUs) on the others."""
PAPER_ETA = 0.2
"""round(0.2 C) A100s: 2 of 9 and 5 of 26, the A100/MIG mix of the two deployments."""


@dataclass(frozen=True)
class SessionSetup:
    """Per-session constants added before the first token: the client's start and the cache allocation."""

    initial_s: float = 0.0
    allocation_s: float = 0.0

    @property
    def total_s(self) -> float:
        """Seconds from admission to the start of prefill."""
        return self.initial_s + self.allocation_s


def calibrated_setup(system: str) -> SessionSetup:
    """The authors' simulator's fitted constants: 70 ms start, then 60 s (proposed) or 250 s (PETALS) allocation."""
    return SessionSetup(0.070, 60.0 if system == "proposed" else 250.0)


def roofline_block_times(output_len: int = 128) -> dict[str, tuple[float, float]]:
    """Our roofline catalog's (tau, tau^I) for one NF4 BLOOM block: A100-80G, and a MIG as 1/7 compute, 1/8 HBM."""
    from opentela.scheduler.bprr.catalog import block_times
    from opentela.scheduler.hardware import builtin_catalog
    from opentela.scheduler.models import ModelSpec as Arch
    from opentela.scheduler.roofline import Precision

    # BLOOM's MLP is 4d wide with two matrices; the catalog's gated MLP has three, so 8d/3 gives the same weights.
    arch = Arch("BLOOM-176B", D_MODEL, L_BLOCKS, 112, 112, 128, 8 * D_MODEL // 3, 250880, 2048)
    device = builtin_catalog()["A100-80G"]
    mig = replace(
        device,
        name="A100-MIG-1g.10gb",
        tflops={k: v / 7 for k, v in device.tflops.items()},
        memory_bandwidth_gbs=device.memory_bandwidth_gbs / 8,
    )
    precision = Precision(weights="int4")
    return {
        d.name: block_times(arch, d, precision, INPUT_LEN, output_len)  # (decode, prefill)
        for d in (device, mig)
    }
