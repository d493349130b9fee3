"""The hardware catalog: peak throughput per dtype, memory, bandwidth and interconnect of GPUs and CPU nodes."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from opentela.errors import ConfigError
from opentela.scheduler.step_model import StepModel

GIB = 1024**3
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU socket group) as the roofline model sees it."""

    name: str
    kind: str
    memory_gib: float
    memory_bandwidth_gbs: float
    tflops: Mapping[str, float]
    interconnect_gbs: float = 0.0
    devices_per_node: int = 1
    cores: int = 0
    source: str = ""
    efficiency: float = 1.0
    """Fraction of the peak FLOP/s reached in practice (1.0: pure roofline); calibrated where measured."""
    memory_efficiency: float = 1.0
    """Fraction of the peak memory bandwidth reached (1.0 where the catalog gives a measured figure)."""
    notes: tuple[str, ...] = field(default=())
    step: StepModel = field(default_factory=StepModel)
    """Per-step overhead and per-operator-class efficiencies of the engine on this device (calibration)."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes."""
        return self.memory_gib * GIB

    @property
    def bandwidth(self) -> float:
        """Achievable memory bandwidth in bytes per second."""
        return self.memory_bandwidth_gbs * 1e9 * self.memory_efficiency

    def peak(self, dtype: str) -> float:
        """Achievable dense throughput in operations per second for `dtype`, falling back to fp16 then fp32."""
        for key in (dtype, "fp16", "bf16", "fp32"):
            if key in self.tflops:
                return self.tflops[key] * 1e12 * self.efficiency
        raise ConfigError(f"device {self.name} lists no throughput for {dtype} or fp16")

    @property
    def link_bandwidth(self) -> float:
        """Per-direction bytes per second to the other devices of a node, for tensor-parallel all-reduce."""
        return self.interconnect_gbs * 1e9

    def calibrated(self, efficiency: float, memory_efficiency: float | None = None) -> Device:
        """A copy of this device reaching `efficiency` of its peak FLOP/s (and of its bandwidth, if given)."""
        memory = self.memory_efficiency if memory_efficiency is None else memory_efficiency
        return replace(self, efficiency=efficiency, memory_efficiency=memory)

    def with_step(self, step: StepModel) -> Device:
        """A copy of this device whose steps follow `step` (a calibrated step model)."""
        return replace(self, step=step)


def _device(name: str, raw: Mapping[str, Any], where: str) -> Device:
    try:
        tflops = {str(k): float(v) for k, v in dict(raw["tflops"]).items()}
        unknown = set(tflops) - set(DTYPES)
        if unknown:
            raise ConfigError(f"{where}: device {name}: unknown dtypes {sorted(unknown)}; known: {DTYPES}")
        device = Device(
            name=name,
            kind=str(raw.get("kind", "gpu")),
            memory_gib=float(raw["memory_gib"]),
            memory_bandwidth_gbs=float(raw["memory_bandwidth_gbs"]),
            tflops=tflops,
            interconnect_gbs=float(raw.get("interconnect_gbs", 0.0)),
            devices_per_node=int(raw.get("devices_per_node", 1)),
            cores=int(raw.get("cores", 0)),
            source=str(raw.get("source", "")),
            efficiency=float(raw.get("efficiency", 1.0)),
            memory_efficiency=float(raw.get("memory_efficiency", 1.0)),
            step=StepModel.from_dict(raw.get("step") or {}, f"{where}: device {name}: step"),
        )
    except KeyError as exc:
        raise ConfigError(f"{where}: device {name} lacks the field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: device {name}: {exc}") from None
    if device.memory_gib <= 0 or device.memory_bandwidth_gbs <= 0 or not device.tflops:
        raise ConfigError(f"{where}: device {name} needs positive memory, bandwidth and tflops")
    return device


class HardwareCatalog(Mapping[str, Device]):
    """Devices by name (case-insensitive): the shipped catalog plus operators' own files."""

    def __init__(self, devices: Mapping[str, Device]) -> None:
        self._devices = {d.name.lower(): d for d in devices.values()}

    def __getitem__(self, name: str) -> Device:
        try:
            return self._devices[name.lower()]
        except KeyError:
            raise ConfigError(f"unknown device {name!r}; known: {', '.join(self.names())}") from None

    def __iter__(self) -> Iterator[str]:
        return (d.name for d in self._devices.values())

    def __len__(self) -> int:
        return len(self._devices)

    def names(self) -> list[str]:
        """Device names in catalog order."""
        return [d.name for d in self._devices.values()]

    def with_file(self, path: str | Path) -> HardwareCatalog:
        """This catalog plus (or overridden by) the devices in an operator's YAML file."""
        devices = dict(self._devices)
        for device in parse_devices(Path(path).read_text(), str(path)).values():
            devices[device.name.lower()] = device
        return HardwareCatalog(devices)


def parse_devices(text: str, where: str = "<string>") -> dict[str, Device]:
    """Parse a hardware YAML document (name -> fields) into devices."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of device name to fields")
    return {str(name): _device(str(name), fields or {}, where) for name, fields in raw.items()}


@cache
def builtin_catalog() -> HardwareCatalog:
    """The catalog shipped with the package (data/hardware.yaml)."""
    text = resources.files("opentela.scheduler").joinpath("data/hardware.yaml").read_text()
    return HardwareCatalog(parse_devices(text, "hardware.yaml"))


def load_catalog(extra: str | Path | None = None) -> HardwareCatalog:
    """The shipped catalog, extended by the operator's file `extra` if given."""
    catalog = builtin_catalog()
    return catalog.with_file(extra) if extra else catalog


# Matrix operations per cycle per core, by the widest instruction set extension present (x86 flags).
_X86_OPS_PER_CYCLE = (
    ("amx_int8", {"fp32": 32, "bf16": 1024, "fp16": 1024, "int8": 2048}),
    ("avx512_vnni", {"fp32": 32, "bf16": 64, "fp16": 32, "int8": 128}),
    ("avx512f", {"fp32": 32, "bf16": 32, "fp16": 32, "int8": 64}),
    ("avx2", {"fp32": 32, "bf16": 32, "fp16": 32, "int8": 64}),
)


def host_cpu_device(
    threads: int | None = None,
    memory_bandwidth_gbs: float = 20.0,
    ghz: float | None = None,
    cpuinfo: str | None = None,
) -> Device:
    """A CPU device entry for this machine from /proc/cpuinfo, using `threads` cores.

    Memory bandwidth cannot be read from the flags; pass a measured figure (a STREAM-like copy).
    """
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    flag_line = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(flag_line.group(1).split()) if flag_line else set()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)]
    cores = threads or len(os.sched_getaffinity(0))
    clock = ghz or (max(mhz) / 1000 if mhz else 2.0)
    ops = next((o for flag, o in _X86_OPS_PER_CYCLE if flag in flags), {"fp32": 8, "int8": 16})
    if "avx512_bf16" in flags:
        ops = {**ops, "bf16": max(ops.get("bf16", 0), 64)}
    tflops = {k: v * cores * clock * 1e9 / 1e12 for k, v in ops.items()}
    extension = next((flag for flag, _ in _X86_OPS_PER_CYCLE if flag in flags), "scalar")
    return Device(
        name="host-cpu",
        kind="cpu",
        cores=cores,
        memory_gib=32.0,
        memory_bandwidth_gbs=memory_bandwidth_gbs,
        tflops=tflops,
        source=f"/proc/cpuinfo: {model.group(1) if model else 'unknown'}, {clock:.2f} GHz, {extension}",
    )
