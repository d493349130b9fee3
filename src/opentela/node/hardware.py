"""The hardware probe: GPUs, CPU, memory and OS of this node, as a JSON-serializable dict for its record."""

from __future__ import annotations

import csv
import logging
import os
import platform
import shutil
import socket
import subprocess
from typing import Any

import psutil

logger = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT = 5.0
NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits")
# CPU features that matter for CPU inference (llama.cpp picks kernels by them) and for placement.
CPU_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "asimddp",
    "sve",
    "sve2",
)


def probe_hardware(*, use_nvml: bool = True) -> dict[str, Any]:
    """Describe this machine; never raises and returns within a few seconds.

    Keys: ``gpus`` (list of {index, name, memory_mib, uuid}, filtered by CUDA_VISIBLE_DEVICES),
    ``gpu_source`` ("nvml", "nvidia-smi" or None), ``cpu`` ({model, arch, cores, threads, usable, flags}),
    ``ram_mib``, ``os`` and ``hostname``. Blocking: call it with ``asyncio.to_thread`` from a loop.
    """
    gpus, source = _probe_gpus(use_nvml)
    return {
        "gpus": _visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")),
        "gpu_source": source,
        "cpu": _guard(_probe_cpu, {}),
        "ram_mib": _guard(lambda: psutil.virtual_memory().total // 2**20, 0),
        "os": _guard(lambda: f"{platform.system()} {platform.release()}".strip(), ""),
        "hostname": _guard(socket.gethostname, ""),
    }


def _guard(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:
        logger.debug("hardware probe step failed", exc_info=True)
        return default


def _probe_gpus(use_nvml: bool) -> tuple[list[dict[str, Any]], str | None]:
    if use_nvml:
        gpus = _guard(_nvml_gpus, None)
        if gpus is not None:
            return gpus, "nvml"
    gpus = _guard(_nvidia_smi_gpus, None)
    if gpus is not None:
        return gpus, "nvidia-smi"
    return [], None


def _nvml_gpus() -> list[dict[str, Any]] | None:
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_mib": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_gpus() -> list[dict[str, Any]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, *NVIDIA_SMI_QUERY],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        # Present but broken (no driver loaded, hung device): report no GPUs rather than fail the node.
        logger.warning("nvidia-smi failed, reporting no GPUs: %s", exc)
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits``."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(row) < 4:
            continue
        index, name, memory, uuid = (c.strip() for c in row[:4])
        try:
            gpus.append({"index": int(index), "name": name, "memory_mib": int(float(memory)), "uuid": uuid})
        except ValueError:
            continue  # "[N/A]" or a warning line mixed into the output
    return gpus


def _visible(gpus: list[dict[str, Any]], visible: str | None) -> list[dict[str, Any]]:
    """Keep the GPUs CUDA_VISIBLE_DEVICES lets the engine use (indices or UUIDs), in its order."""
    if visible is None or not gpus:
        return gpus
    chosen: list[dict[str, Any]] = []
    for item in (v.strip() for v in visible.split(",")):
        if not item:
            continue
        if item.startswith("MIG-"):
            return gpus  # MIG instances cannot be mapped to whole devices here; report them all
        match = [
            g for g in gpus if (item.isdigit() and g["index"] == int(item)) or g["uuid"].startswith(item)
        ]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def _probe_cpu() -> dict[str, Any]:
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or info.get("Hardware") or platform.processor()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    threads = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else threads
    return {
        "model": model or platform.machine(),
        "arch": platform.machine(),
        "cores": psutil.cpu_count(logical=False) or threads,
        "threads": threads,
        "usable": usable,
        "flags": sorted(f for f in CPU_FLAGS if f in flags),
    }


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (Linux), else nothing."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if info:
                        break  # the first processor's block ended
                    continue
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info
