"""The fleet controller's decision, without I/O: idle nodes from registry records, a plan over their devices,
and per-node assignments (which model, on which GPUs) that respect node boundaries."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentela._types import Lifecycle
from opentela.scheduler.hardware import HardwareCatalog, builtin_catalog
from opentela.scheduler.placement import Cluster, Plan

# First match wins: more specific names before the general ones.
_GPU_NAMES = (
    (r"GH200", "GH200"),
    (r"H200", "H200"),
    (r"H100.*PCIe", "H100-PCIe"),
    (r"H100", "H100-SXM"),
    (r"A100.*80", "A100-80G"),
    (r"A100", "A100-40G"),
    (r"L40S", "L40S"),
    (r"A10G?\b", "A10G"),
    (r"3090", "RTX-3090"),
    (r"4090", "RTX-4090"),
    (r"V100", "V100-32G"),
)


def device_type(gpu_name: str) -> str | None:
    """The catalog name of a GPU as NVML or nvidia-smi report it (``NVIDIA A100-SXM4-80GB``), or None."""
    for pattern, name in _GPU_NAMES:
        if re.search(pattern, gpu_name, re.IGNORECASE):
            return name
    return None


@dataclass(frozen=True)
class IdleNode:
    """A node that serves nothing yet: its peer id, its GPU type and the indices of its GPUs of that type."""

    peer_id: str
    device: str
    gpus: tuple[int, ...]


def idle_nodes(records: Iterable[Any]) -> list[IdleNode]:
    """Nodes that are up and serve no model, one entry per GPU type they hold (records as in the registry)."""
    out = []
    for record in records:
        if Lifecycle(record.lifecycle) not in (Lifecycle.JOIN, Lifecycle.SERVING) or record.models:
            continue
        by_type: dict[str, list[int]] = {}
        for gpu in (record.hardware or {}).get("gpus", ()):
            kind = device_type(str(gpu.get("name", "")))
            if kind:
                by_type.setdefault(kind, []).append(int(gpu.get("index", len(by_type.get(kind, [])))))
        out.extend(IdleNode(record.peer_id, kind, tuple(sorted(g))) for kind, g in by_type.items())
    return out


def cluster_of(nodes: Sequence[IdleNode], catalog: HardwareCatalog | None = None) -> Cluster:
    """The devices of `nodes` as a placement cluster; TP per type is capped by the largest idle node."""
    catalog = catalog or builtin_catalog()
    counts: dict[str, int] = {}
    widest: dict[str, int] = {}
    for node in nodes:
        counts[node.device] = counts.get(node.device, 0) + len(node.gpus)
        widest[node.device] = max(widest.get(node.device, 0), len(node.gpus))
    devices = {d.name.lower(): d for d in catalog.values()}
    for name, width in widest.items():
        entry = catalog[name]
        devices[name.lower()] = replace(entry, devices_per_node=min(entry.devices_per_node, width))
    return Cluster(counts, HardwareCatalog(devices))


@dataclass(frozen=True)
class Assignment:
    """One replica to start: `model` on GPUs `gpus` of node `peer_id`, tensor-parallel across them."""

    peer_id: str
    model: str
    device: str
    tp: int
    gpus: tuple[int, ...]


def assign(plan: Plan, nodes: Sequence[IdleNode]) -> tuple[list[Assignment], list[tuple[str, str, int]]]:
    """Pack each group's replicas onto nodes of its device type (TP never spans nodes).

    Best fit: widest replicas first, each onto the node with the fewest free GPUs that still holds it, so
    large nodes stay whole for wide replicas. Returns the assignments and the (model, device, tp) replicas that
    found no room (possible when nodes are narrower or more fragmented than the plan assumed).
    """
    free = {(n.peer_id, n.device): list(n.gpus) for n in nodes}
    replicas = [(g.model, g.device, g.tp) for g in plan.groups for _ in range(g.dp)]
    replicas.sort(key=lambda r: -r[2])
    done: list[Assignment] = []
    missing: list[tuple[str, str, int]] = []
    for model, device, tp in replicas:
        fits = [key for key, gpus in free.items() if key[1] == device and len(gpus) >= tp]
        if not fits:
            missing.append((model, device, tp))
            continue
        key = min(fits, key=lambda k: (len(free[k]), k[0]))
        gpus, free[key] = free[key][:tp], free[key][tp:]
        done.append(Assignment(key[0], model, device, tp, tuple(gpus)))
    return done, missing
