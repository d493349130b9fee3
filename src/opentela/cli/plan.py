"""`otela plan`: place models on a cluster's idle devices (CP-SAT), or with `--pipeline` split one model's blocks
across servers (BPRR: CG-BPRR, CG-BP, PETALS' heuristic or the exact MILP), or with `--failover` lay a tensor-parallel
replica out on the GPUs a node has left (RaidServe, cli/plan_tp.py)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from opentela.cli import plan_tp
from opentela.errors import ConfigError
from opentela.scheduler.commands import add_plan_arguments
from opentela.scheduler.commands import run as run_placement

ALGORITHMS = ("cg-bprr", "cg-bp", "petals", "milp")


class _OptionalFlags:
    """Adds the CP-SAT flags without `required`: --pipeline needs neither --cluster nor --workload/--trace."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        kwargs.pop("required", None)
        return self.parser.add_argument(*args, **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `otela plan` (CP-SAT placement) and of its `--pipeline` mode."""
    add_plan_arguments(cast(argparse.ArgumentParser, _OptionalFlags(p)))
    g = p.add_argument_group("pipeline mode (one model split across servers by block ranges)")
    g.add_argument(
        "--pipeline",
        metavar="FILE",
        help="YAML/JSON: model, servers (name + gpu, or memory_gib + tau_decode_ms), clients, requests, rtt_ms",
    )
    g.add_argument(
        "--rtt",
        metavar="FILE|URL",
        help="RTTs in ms: YAML/JSON {client: {server: ms}} or CSV; or a node's URL, whose probes measured them "
        "(its /v1/dnt/rtt: the node is the client, servers are named by peer id)",
    )
    g.add_argument("--algorithm", choices=ALGORITHMS, default="cg-bprr", help="planner (default cg-bprr)")
    g.add_argument("--requests", type=int, metavar="N", help="|R|: requests per client (overrides the file)")
    g.add_argument(
        "--rate", type=float, metavar="REQ_PER_S", help="cg-bp: size for arrivals at this rate (mean + 1 std)"
    )
    g.add_argument(
        "--objective",
        choices=("decode", "all-tokens"),
        default="decode",
        help="per-token time of decoding tokens (Eq. 4) or of all tokens, first included (Eq. 8)",
    )
    plan_tp.add_arguments(p)


def run(ns: argparse.Namespace) -> int:
    """Run the CP-SAT placement, the BPRR planner with --pipeline, or the TP failover plan with --failover."""
    if ns.failover:
        return plan_tp.run(ns)
    if not ns.pipeline:
        if not ns.cluster or not (ns.workload or ns.trace):
            raise ConfigError(
                "otela plan needs --cluster and --workload or --trace (or --pipeline FILE for a split model, or "
                "--failover MODEL for a tensor-parallel replica on fewer GPUs)"
            )
        return run_placement(ns)
    doc = pipeline_command(ns)
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        print_pipeline(doc, Console())
    return 0 if doc["status"] in ("optimal", "feasible") else 1


def fetch_rtt(url: str) -> dict[str, dict[str, float]]:
    """The round trips a live node measured to its peers (GET /v1/dnt/rtt), as an RTT table."""
    import urllib.error
    import urllib.request

    from opentela.scheduler.bprr.spec_file import rtt_table

    where = url.rstrip("/").removesuffix("/v1") + "/v1/dnt/rtt"
    try:
        with urllib.request.urlopen(where, timeout=10) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read measured RTTs from {where}: {exc}") from None
    return rtt_table(doc, where)


def pipeline_command(ns: argparse.Namespace) -> dict[str, Any]:
    """Plan the split model of `--pipeline`; returns the JSON document printed."""
    from opentela.scheduler import bprr
    from opentela.scheduler.bprr.spec_file import load_pipeline, load_rtt_file
    from opentela.scheduler.hardware import load_catalog
    from opentela.scheduler.roofline import Precision

    if ns.requests is not None and ns.requests < 1:
        raise ConfigError("--requests must be at least 1")
    if ns.rate is not None and ns.rate <= 0:
        raise ConfigError("--rate must be positive")
    if not 0 < ns.mem_util <= 1:
        raise ConfigError("--mem-util must be in (0, 1]")
    rtt = (
        (fetch_rtt(ns.rtt) if ns.rtt.startswith(("http://", "https://")) else load_rtt_file(ns.rtt))
        if ns.rtt
        else None
    )
    instance = load_pipeline(
        ns.pipeline,
        load_catalog(ns.hardware),
        precision=Precision(ns.weights, ns.kv_dtype),
        mem_util=ns.mem_util,
        rtt=rtt,
        requests=ns.requests,
    )
    objective: bprr.Objective = "decode" if ns.objective == "decode" else "all_tokens"
    if ns.algorithm == "cg-bprr":
        plan = bprr.cg_bprr(instance, objective)
    elif ns.algorithm == "milp":
        plan = bprr.solve_milp(instance, objective=objective, time_limit_s=ns.time_limit)
    elif ns.algorithm == "cg-bp":
        r = bprr.choose_concurrency(instance, ns.rate) if ns.rate else instance.n_requests
        plan = bprr.route_plan(instance, bprr.cg_bp(instance, r), "shortest", objective)
    else:
        plan = bprr.route_plan(instance, bprr.petals_placement(instance), "petals", objective)
    return _document(instance, plan)


def _document(instance: Any, plan: Any) -> dict[str, Any]:
    from opentela.scheduler import bprr

    model = instance.model
    servers = []
    for j, s in enumerate(instance.servers):
        start, end = plan.placement.span(j)
        servers.append(
            {
                "name": s.name,
                "gpu": s.gpu,
                "memory_gib": round(s.memory_bytes / 1024**3, 3),
                "tau_decode_ms": round(s.tau_decode_s * 1000, 4),
                "blocks": [start, end] if end > start else None,
                "cache_slots": plan.cache_slots[j],
            }
        )
    chains = []
    seen: set[int] = set()
    for route in plan.routing.routes if plan.routing else ():
        if route.client in seen:
            continue
        seen.add(route.client)
        chains.append(
            {
                "client": instance.clients[route.client],
                "hops": [[instance.servers[h.server].name, h.first_block, h.end_block] for h in route.hops],
                "per_token_s": bprr.route_token_time(instance, route),
                "first_token_s": bprr.route_first_token_time(instance, route),
            }
        )
    return {
        "model": model.name,
        "n_blocks": model.n_blocks,
        "block_gib": round(model.block_bytes / 1024**3, 4),
        "cache_mib_per_block_session": round(model.cache_bytes / 1024**2, 3),
        "algorithm": plan.algorithm,
        "status": plan.status,
        "concurrency": plan.concurrency,
        "mean_token_time_s": plan.mean_token_time_s,
        "bound_s": plan.bound_s if plan.bound_s is None or math.isfinite(plan.bound_s) else None,
        "solve_s": plan.solve_s,
        "servers": servers,
        "chains": chains,
    }


def print_pipeline(doc: dict[str, Any], console: Console) -> None:
    """The placement and each client's chain as tables."""
    table = Table(
        title=f"{doc['model']}: {doc['n_blocks']} blocks, {doc['algorithm']} "
        f"({doc['status']}, sized for |R| = {doc['concurrency']} concurrent requests)"
    )
    for col in ("server", "gpu", "memory GiB", "decode ms/block", "blocks", "cache slots"):
        table.add_column(col, justify="left" if col in ("server", "gpu") else "right")
    for s in doc["servers"]:
        blocks = f"[{s['blocks'][0]}, {s['blocks'][1]})" if s["blocks"] else "-"
        table.add_row(
            s["name"],
            s["gpu"] or "-",
            f"{s['memory_gib']:g}",
            f"{s['tau_decode_ms']:g}",
            blocks,
            str(s["cache_slots"]),
        )
    console.print(table)
    if doc["status"] not in ("optimal", "feasible"):
        console.print("[red]no placement covers every block: add servers or lower --requests / --rate[/red]")
        return
    for chain in doc["chains"]:
        hops = " -> ".join(f"{name}[{a}, {b})" for name, a, b in chain["hops"])
        console.print(
            f"{chain['client']}: {hops}; {chain['per_token_s'] * 1000:.1f} ms per token, "
            f"first token {chain['first_token_s'] * 1000:.1f} ms"
        )
    extra = (
        f", guaranteed <= {doc['bound_s'] * 1000:.1f} ms (Theorem 3.5)" if doc["bound_s"] is not None else ""
    )
    console.print(
        f"mean per-token time {doc['mean_token_time_s'] * 1000:.1f} ms{extra}; solved in {doc['solve_s']:.3f} s"
    )


__all__ = ["add_arguments", "run"]
