"""The fleet controller's decision, without I/O: idle nodes from registry records, a plan over their devices,
and per-node assignments (which model, on which GPUs) that respect node boundaries."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentela._types import Lifecycle
from opentela.scheduler.hardware import Device, HardwareCatalog, builtin_catalog, host_cpu_device
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


STARTING = "starting "
"""How the record's reason of a node loading an assigned engine begins (node/control.py writes it)."""

CPU_MEMORY_BANDWIDTH_GBS = 20.0
"""Memory bandwidth assumed for a CPU node (the record cannot tell it): a dual-channel DDR4 desktop's."""


def cpu_device(cpu: Mapping[str, Any], ram_mib: int = 0) -> Device:
    """A catalog entry for a CPU-only node from its record's ``cpu`` description (flags, usable threads).

    Built like `host_cpu_device` (matrix operations per cycle from the instruction set extensions, 2 GHz,
    `CPU_MEMORY_BANDWIDTH_GBS`), named after its shape, e.g. ``CPU-16T-avx512f``, so alike nodes share a type.
    """
    flags = " ".join(str(f) for f in cpu.get("flags", ()))
    threads = max(int(cpu.get("usable") or cpu.get("threads") or 1), 1)
    entry = host_cpu_device(
        threads=threads,
        memory_bandwidth_gbs=CPU_MEMORY_BANDWIDTH_GBS,
        ghz=2.0,
        cpuinfo=f"flags\t: {flags}\nmodel name\t: {cpu.get('model', 'unknown')}\n",
    )
    extension = next(
        (f for f in ("amx_int8", "avx512_vnni", "avx512f", "avx2") if f in flags.split()), "scalar"
    )
    memory = ram_mib / 1024 if ram_mib > 0 else entry.memory_gib
    return replace(entry, name=f"CPU-{threads}T-{extension}", memory_gib=memory)


@dataclass(frozen=True)
class IdleNode:
    """A node that serves nothing yet: its peer id, its device type and the indices of its GPUs of that type.

    A CPU-only node has no GPU indices, counts as one device, and carries its own catalog `entry`.
    """

    peer_id: str
    device: str
    gpus: tuple[int, ...]
    entry: Device | None = None

    @property
    def devices(self) -> int:
        """How many devices of its type the node adds to the cluster."""
        return len(self.gpus) if self.gpus else 1


def idle_nodes(records: Iterable[Any], *, cpu_nodes: bool = True) -> list[IdleNode]:
    """Worker nodes that are up and serve no model (nor blocks of one), one entry per GPU type they hold.

    Ingress and controller nodes never count. A worker without GPUs counts as one CPU device when `cpu_nodes`
    (see `cpu_device`); GPUs whose name matches no catalog entry are left out.
    """
    out: list[IdleNode] = []
    for record in records:
        if Lifecycle(record.lifecycle) not in (Lifecycle.JOIN, Lifecycle.SERVING) or record.models:
            continue
        if getattr(record, "blocks", ()):
            continue  # a block server of a split model
        if record.roles and "worker" not in record.roles:
            continue
        if str(record.reason).startswith(STARTING):
            continue  # loading an engine it was assigned: not idle, whoever assigned it
        hardware = record.hardware or {}
        by_type: dict[str, list[int]] = {}
        for gpu in hardware.get("gpus", ()):
            kind = device_type(str(gpu.get("name", "")))
            if kind:
                by_type.setdefault(kind, []).append(int(gpu.get("index", len(by_type.get(kind, [])))))
        out.extend(IdleNode(record.peer_id, kind, tuple(sorted(g))) for kind, g in by_type.items())
        if cpu_nodes and not hardware.get("gpus") and hardware.get("cpu"):
            entry = cpu_device(hardware["cpu"], int(hardware.get("ram_mib") or 0))
            out.append(IdleNode(record.peer_id, entry.name, (), entry))
    return out


def cluster_of(nodes: Sequence[IdleNode], catalog: HardwareCatalog | None = None) -> Cluster:
    """The devices of `nodes` as a placement cluster; TP per type is capped by the largest idle node."""
    catalog = catalog or builtin_catalog()
    counts: dict[str, int] = {}
    widest: dict[str, int] = {}
    own = {n.device: n.entry for n in nodes if n.entry is not None}
    for node in nodes:
        counts[node.device] = counts.get(node.device, 0) + node.devices
        widest[node.device] = max(widest.get(node.device, 0), node.devices)
    devices = {d.name.lower(): d for d in catalog.values()}
    for name, width in widest.items():
        entry = own.get(name) or catalog[name]
        devices[name.lower()] = replace(entry, devices_per_node=min(entry.devices_per_node, width))
    return Cluster(counts, HardwareCatalog(devices))


_CPU_SLOT = -1  # the one device of a CPU node, which has no GPU index


@dataclass(frozen=True)
class ReplicaAssignment:
    """One replica to start: `model` on GPUs `gpus` of node `peer_id` (none: a CPU node), tensor-parallel."""

    peer_id: str
    model: str
    device: str
    tp: int
    gpus: tuple[int, ...]


def assign(
    plan: Plan, nodes: Sequence[IdleNode], *, one_per_node: bool = False
) -> tuple[list[ReplicaAssignment], list[tuple[str, str, int]]]:
    """Pack each group's replicas onto nodes of its device type (TP never spans nodes).

    With `one_per_node` a node takes at most one replica (an OpenTela node runs one engine); the GPUs it has
    beyond the replica's TP stay idle.

    Best fit: widest replicas first, each onto the node with the fewest free GPUs that still holds it, so
    large nodes stay whole for wide replicas. Returns the assignments and the (model, device, tp) replicas that
    found no room (possible when nodes are narrower or more fragmented than the plan assumed).
    """
    free = {(n.peer_id, n.device): list(n.gpus) or [_CPU_SLOT] for n in nodes}
    replicas = [(g.model, g.device, g.tp) for g in plan.groups for _ in range(g.dp)]
    replicas.sort(key=lambda r: -r[2])
    done: list[ReplicaAssignment] = []
    missing: list[tuple[str, str, int]] = []
    for model, device, tp in replicas:
        fits = [key for key, gpus in free.items() if key[1] == device and len(gpus) >= tp]
        if not fits:
            missing.append((model, device, tp))
            continue
        key = min(fits, key=lambda k: (len(free[k]), k[0]))
        gpus, free[key] = free[key][:tp], free[key][tp:]
        if one_per_node:
            for other in [k for k in free if k[0] == key[0]]:
                del free[other]
        done.append(ReplicaAssignment(key[0], model, device, tp, tuple(g for g in gpus if g != _CPU_SLOT)))
    return done, missing
