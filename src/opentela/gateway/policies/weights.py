"""How much serving capacity a replica advertises: its explicit weight or throughput, else its GPU class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentela.registry.record import NodeRecord

GPU_CLASS_WEIGHTS: Mapping[str, float] = {
    # Relative decode speed of common serving GPUs (H100 = 1), by memory bandwidth; longest names first so
    # "GH200" is not read as "H200" and "A100" not as "A10".
    "GB200": 2.4,
    "B200": 2.4,
    "GH200": 1.2,
    "H200": 1.4,
    "H100": 1.0,
    "MI300X": 1.5,
    "A100": 0.6,
    "L40S": 0.26,
    "L40": 0.26,
    "A6000": 0.23,
    "4090": 0.3,
    "V100": 0.27,
    "A10": 0.18,
    "L4": 0.09,
    "T4": 0.1,
}
CPU_WEIGHT = 0.02
"""A CPU-only replica: worth much less than any GPU, but not nothing."""


def gpu_class_weight(name: str, table: Mapping[str, float] = GPU_CLASS_WEIGHTS) -> float | None:
    """The class weight of a GPU by (a fragment of) its marketing name; None when it is not in the table."""
    upper = name.upper()
    for fragment in sorted(table, key=len, reverse=True):
        if fragment.upper() in upper:
            return table[fragment]
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number > 0 else None


def replica_weight(record: NodeRecord, model: str, table: Mapping[str, float] = GPU_CLASS_WEIGHTS) -> float:
    """The weight of `record` for `model`, from the most specific metadata it advertises.

    An explicit ``weight`` or advertised ``throughput`` (tokens/s) in the model's settings wins; then the
    declared ``gpu`` of the model entry (a simulated engine says which GPU it stands for); then the node's
    probed GPUs, summed; a node without GPUs weighs `CPU_WEIGHT`. Unknown GPUs count by their memory.
    """
    entry = next((m for m in record.models if m.id == model), None)
    settings: Mapping[str, Any] = entry.settings if entry is not None else {}
    for key in ("weight", "throughput"):
        explicit = _number(settings.get(key))
        if explicit is not None:
            return explicit
    declared = settings.get("gpu")
    if isinstance(declared, str) and declared:
        return gpu_class_weight(declared, table) or 1.0
    total = 0.0
    for gpu in record.hardware.get("gpus") or ():
        if not isinstance(gpu, Mapping):
            continue
        weight = gpu_class_weight(str(gpu.get("name", "")), table)
        if weight is None:
            memory = _number(gpu.get("memory_mib")) or 0.0
            weight = memory / 81920 if memory else 0.1
        total += weight
    return total or CPU_WEIGHT
