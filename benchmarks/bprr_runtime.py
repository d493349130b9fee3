"""Running time of the BPRR planners at the sizes of Sun et al.'s Table 6, printed as JSON.

Sizes follow the paper's evaluation: BLOOM-176B (70 blocks); clustered = 9 servers (2 A100 + 7 MIG) in three
clusters with 5 ms / 100 ms RTTs (their Table 2); AboveNet = 9 servers on 23 nodes; BellCanada and GTS-CE = 26
servers (5 A100 + 21 MIG) on 48 and 149 nodes. The topologies themselves are not shipped here: scattered RTTs are
drawn uniformly in [1, 50] ms, which changes the chains chosen but not the work the algorithms do. Per-block times
and memory are round figures chosen so PETALS puts 53 blocks on an A100 and 4 on a MIG as the paper reports; they
are inputs to the timing, not a calibration.

Timed per scenario (mean and std over --repeats runs, seconds): choosing |R| (mean + 1 std of arrivals at
0.5 req/s), CG-BP, CG-BPRR (offline, |R| requests), PETALS' placement, and per request WS-RR, the exact (21)
router ('Optimized RR') and PETALS' router against servers whose caches are 80 % full of random sessions. The
'total' rows add 100 requests' routing to the placement, as the paper's runs had 100 requests.

    python benchmarks/bprr_runtime.py [--repeats 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opentela.chain_routing import SpanInfo, min_wait_chain, petals_chain, ws_rr_chain
from opentela.scheduler.bprr import (
    Instance,
    ModelSpec,
    Network,
    Plan,
    ServerSpec,
    cg_bp,
    cg_bprr,
    choose_concurrency,
    client_spans,
    petals_placement,
)

GIB = 1024**3
BLOOM = ModelSpec(
    "BLOOM-176B", 70, 1_345_000_000, 2 * 14336 * 2, input_len=20, output_len=128, token_bytes=14336 * 2
)
A100 = dict(memory_bytes=78 * GIB, tau_decode_s=0.005, tau_prefill_s=0.015, gpu="A100-80G")
MIG = dict(memory_bytes=7 * GIB, tau_decode_s=0.02, tau_prefill_s=0.06, gpu="A100-MIG-1g.10gb")
REQUESTS = 100
RATE = 0.5


def _servers(n_a100: int, n_mig: int) -> tuple[ServerSpec, ...]:
    kinds = [("a100", A100)] * n_a100 + [("mig", MIG)] * n_mig
    return tuple(ServerSpec(f"{k}-{i}", **spec) for i, (k, spec) in enumerate(kinds))  # type: ignore[arg-type]


def clustered() -> Instance:
    """Table 2: clients in clusters 0-2; cluster 1 has the two A100s, cluster 2 the seven MIGs."""
    servers = _servers(2, 7)
    where = [1, 1] + [2] * 7
    rtt = [[0.005 if c == w else 0.1 for w in where] for c in range(3)]
    bw = [[1e9 if c == w else 1e8 for w in where] for c in range(3)]
    net = Network.from_latency(
        rtt, n_clients=3, n_servers=9, bandwidth_bps=bw, token_bytes=BLOOM.token_bytes, input_len=20
    )
    return Instance(BLOOM, servers, ("cluster0", "cluster1", "cluster2"), net, (REQUESTS, 0, 0))


def scattered(n_a100: int, n_mig: int, rng: np.random.Generator) -> Instance:
    """One proxy client; RTTs drawn in [1, 50] ms, 1 Gbit/s links."""
    servers = _servers(n_a100, n_mig)
    rtt = rng.uniform(0.001, 0.05, size=(1, len(servers))).tolist()
    net = Network.from_latency(
        rtt,
        n_clients=1,
        n_servers=len(servers),
        bandwidth_bps=1e9,
        token_bytes=BLOOM.token_bytes,
        input_len=20,
    )
    return Instance(BLOOM, servers, ("proxy",), net, (REQUESTS,))


def _busy_spans(inst: Instance, plan: Plan, rng: np.random.Generator) -> list[SpanInfo]:
    """Client 0's view with every server's caches 80 % full of sessions ending within a minute."""
    sessions = {}
    for j, slots in enumerate(plan.cache_slots):
        m = max(plan.placement.counts[j], 1)
        count = int(0.8 * slots) // m
        sessions[j] = [(float(rng.uniform(0, 60)), m) for _ in range(count)]
    return client_spans(inst, plan.placement, 0, cache_slots=plan.cache_slots, sessions=sessions)


def _time(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return {"mean": statistics.fmean(runs), "std": statistics.stdev(runs) if repeats > 1 else 0.0}


def measure(name: str, inst: Instance, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    """Time every algorithm on one scenario."""
    r = choose_concurrency(inst, RATE)
    ours, petals = cg_bp(inst, r), petals_placement(inst)
    out: dict[str, Any] = {
        "servers": len(inst.servers),
        "concurrency": r,
        "blocks_per_server": {
            "cg-bp": sorted(set(ours.placement.counts)),
            "petals": sorted(set(petals.placement.counts)),
        },
        "choose_concurrency_s": _time(lambda: choose_concurrency(inst, RATE), repeats),
        "cg_bp_s": _time(lambda: cg_bp(inst, r), repeats),
        "cg_bprr_offline_s": _time(
            lambda: cg_bprr(
                Instance(
                    inst.model,
                    inst.servers,
                    inst.clients,
                    inst.network,
                    (r,) + (0,) * (len(inst.clients) - 1),
                )
            ),
            repeats,
        ),
        "petals_placement_s": _time(lambda: petals_placement(inst), repeats),
    }
    busy_ours, busy_petals = _busy_spans(inst, ours, rng), _busy_spans(inst, petals, rng)
    n, out_len = inst.model.n_blocks, inst.model.output_len
    out["ws_rr_per_request_s"] = _time(lambda: ws_rr_chain(busy_ours, n, output_len=out_len), repeats)
    out["optimized_rr_per_request_s"] = _time(
        lambda: min_wait_chain(busy_petals, n, output_len=out_len), repeats
    )
    out["petals_route_per_request_s"] = _time(lambda: petals_chain(busy_petals, n), repeats)
    out["proposed_total_s"] = out["cg_bp_s"]["mean"] + REQUESTS * out["ws_rr_per_request_s"]["mean"]
    out["petals_total_s"] = (
        out["petals_placement_s"]["mean"] + REQUESTS * out["petals_route_per_request_s"]["mean"]
    )
    print(
        f"{name}: proposed {out['proposed_total_s']:.4f} s, petals {out['petals_total_s']:.4f} s",
        file=sys.stderr,
    )
    return out


def main() -> None:
    """Run every scenario and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="runs per measurement (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scattered RTTs and sessions")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    scenarios = {
        "clustered": clustered(),
        "AboveNet": scattered(2, 7, rng),
        "BellCanada": scattered(5, 21, rng),
        "GTS-CE": scattered(5, 21, rng),
    }
    doc = {
        "paper_table_6_s": {
            "clustered": {"petals": [0.0186, 0.0013], "proposed": [0.0216, 0.0004]},
            "AboveNet": {"petals": [0.0190, 0.0081], "proposed": [0.0333, 0.0128]},
            "BellCanada": {"petals": [0.0291, 0.0011], "proposed": [0.0287, 0.0018]},
            "GTS-CE": {"petals": [0.0350, 0.0020], "proposed": [0.0320, 0.0012]},
        },
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "repeats": args.repeats,
        "scenarios": {name: measure(name, inst, args.repeats, rng) for name, inst in scenarios.items()},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
