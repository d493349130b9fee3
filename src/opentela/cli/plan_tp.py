"""`otela plan --failover MODEL`: a tensor-parallel replica on the GPUs a node has left, and what losing one costs.

For each count of available GPUs it prints the GPUs Standard TP, Non-uniform TP and RaidServe run on, the batch
each holds and their imbalance; with `--lost`, the recovery plan of a RaidServe replica on `--gpus` GPUs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from opentela.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the tensor-parallel mode of `otela plan`."""
    g = p.add_argument_group(
        "tensor-parallel failover mode (RaidServe: one replica on the GPUs a node has left)"
    )
    g.add_argument(
        "--failover",
        metavar="MODEL",
        help="a catalog model or config.json: plan its TP replica per GPU count",
    )
    g.add_argument("--device", default="H100-SXM", help="hardware catalog device (default H100-SXM)")
    g.add_argument("--gpus", type=int, default=8, help="GPUs of the node (default 8)")
    g.add_argument(
        "--context",
        type=int,
        default=125_192,
        help="tokens one request must fit (default 125,192: RaidServe's)",
    )
    g.add_argument("--lost", type=int, metavar="GPU", help="plan the recovery after GPU index GPU fails")
    g.add_argument(
        "--inflight",
        default="56x16384",
        metavar="NxTOKENS",
        help="requests in flight at the failure, N of TOKENS each (default 56x16384)",
    )


def _inflight(text: str) -> list[int]:
    count, sep, tokens = text.lower().partition("x")
    try:
        n, t = int(count), int(tokens)
    except ValueError:
        raise ConfigError(f"--inflight must be NxTOKENS, e.g. 56x16384; got {text!r}") from None
    if not sep or n < 0 or t < 0:
        raise ConfigError(f"--inflight must be NxTOKENS with non-negative numbers; got {text!r}")
    return [t] * n


def tp_command(ns: argparse.Namespace) -> dict[str, Any]:
    """The document `otela plan --failover` prints."""
    from opentela.scheduler.hardware import load_catalog
    from opentela.scheduler.models import load_model
    from opentela.scheduler.raidserve import MODES, plan_layout, plan_recovery

    model = load_model(ns.failover)
    catalog = load_catalog(getattr(ns, "hardware", None))
    if ns.device not in catalog:
        raise ConfigError(f"unknown device {ns.device!r}; known: {', '.join(sorted(catalog))}")
    device = catalog[ns.device]
    if not 1 <= ns.gpus <= 64:
        raise ConfigError("--gpus must be between 1 and 64")
    rows = []
    for n in range(1, ns.gpus + 1):
        for mode in MODES:
            layout = plan_layout(model, n, mode)
            tokens = layout.max_batch_tokens(device)
            rows.append(
                {
                    "available": n,
                    "mode": mode,
                    "gpus_used": layout.ranks,
                    "fits": tokens >= ns.context,
                    "max_batch_tokens": max(tokens, 0),
                    "imbalance": {k: round(v, 3) for k, v in layout.imbalance().items()},
                    "replicated_kv_heads": len(layout.replicated),
                }
            )
    doc: dict[str, Any] = {"model": model.name, "device": device.name, "context": ns.context, "layouts": rows}
    if ns.lost is not None:
        before = plan_layout(model, ns.gpus, "raidserve")
        if ns.lost not in before.devices:
            raise ConfigError(f"--lost must be a GPU index below --gpus ({ns.gpus})")
        plan = plan_recovery(before, ns.lost, device, _inflight(ns.inflight))
        doc["recovery"] = {
            "lost": ns.lost,
            "survivors": list(plan.after.devices),
            "replicated_kv_heads_after": list(plan.after.replicated),
            "ffn_shards_reloaded": [len(x) for x in plan.ffn_loaded],
            "pcie_gb": [round(t.pcie / 1e9, 3) for t in plan.on_demand],
            "nvlink_gb": [round(t.nvlink / 1e9, 3) for t in plan.on_demand],
            "naive_reshard_gb": [round(w / 1e9, 3) for w in plan.naive_weights],
            "times_s": {k: round(v, 4) for k, v in plan.times.items()},
        }
    return doc


def print_tp(doc: dict[str, Any], console: Console) -> None:
    """The layouts per GPU count, then the recovery plan."""
    table = Table(title=f"{doc['model']} on {doc['device']}: fits one request of {doc['context']:,} tokens?")
    for col in ("GPUs left", "system", "GPUs used", "batch tokens", "attention", "KV", "replicated heads"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for r in doc["layouts"]:
        used = str(r["gpus_used"]) if r["fits"] else "-"
        table.add_row(
            str(r["available"]),
            r["mode"],
            used,
            f"{r['max_batch_tokens']:,}" if r["fits"] else "does not fit",
            f"{r['imbalance']['attention']:.2f}",
            f"{r['imbalance']['kv']:.2f}",
            str(r["replicated_kv_heads"]),
        )
    console.print(table)
    rec = doc.get("recovery")
    if rec:
        t = rec["times_s"]
        console.print(
            f"losing GPU {rec['lost']}: survivors {rec['survivors']}, replicated KV heads after "
            f"{rec['replicated_kv_heads_after']}; each reads {min(rec['pcie_gb'])}-{max(rec['pcie_gb'])} GB over "
            f"PCIe (a naive re-shard: {min(rec['naive_reshard_gb'])}-{max(rec['naive_reshard_gb'])} GB of weights)"
        )
        console.print(
            f"recovery {t['full'] * 1000:.0f} ms on demand, {t['host'] * 1000:.0f} ms with weights re-sharded, "
            f"{t['recompute']:.1f} s recomputing the lost cache"
        )


def run(ns: argparse.Namespace) -> int:
    """Print the plan (JSON with --json)."""
    doc = tp_command(ns)
    if getattr(ns, "json", False):
        print(json.dumps(doc, indent=2))
    else:
        print_tp(doc, Console())
    return 0
