"""Placement: the problem (cluster, workloads), a plan (allocation and DP x TP per model and device type),
its constraints C1-C3, its evaluation, and the registry of placement policies."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from opentela.errors import ConfigError
from opentela.plugins import Registry
from opentela.scheduler.hardware import Device, HardwareCatalog, load_catalog
from opentela.scheduler.models import ModelSpec, load_model
from opentela.scheduler.simulator import ReplicaSpec, simulate
from opentela.scheduler.tables import LatencyTable, TableBuilder
from opentela.scheduler.workload import Workload, poisson_trace

Progress = Callable[[str, float], None]
"""Progress callback: (phase description, fraction done in [0, 1])."""


@dataclass(frozen=True)
class Cluster:
    """Idle devices by catalog name, and the catalog that describes them."""

    devices: Mapping[str, int]
    catalog: HardwareCatalog

    @classmethod
    def load(cls, path: str | Path, hardware: str | Path | None = None) -> Cluster:
        """A cluster file: ``devices: {A100-80G: 24, GH200: 32}`` and optionally ``hardware: extra.yaml``."""
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read cluster file {path}: {exc}") from None
        devices = raw.get("devices") if isinstance(raw, Mapping) else None
        if not isinstance(devices, Mapping) or not devices:
            raise ConfigError(f"{path}: expected 'devices: {{TYPE: COUNT, ...}}'")
        extra = hardware or raw.get("hardware")
        if extra and not Path(extra).is_absolute() and hardware is None:
            extra = Path(path).parent / extra
        catalog = load_catalog(extra)
        counts = {}
        for name, count in devices.items():
            if not isinstance(count, int) or count < 0:
                raise ConfigError(f"{path}: device count of {name} must be a non-negative integer")
            counts[catalog[str(name)].name] = count
        return cls(counts, catalog)


@dataclass(frozen=True)
class Group:
    """`dp` replicas of `model` on `tp` devices of type `device` each, receiving `share` of the model's traffic."""

    model: str
    device: str
    tp: int
    dp: int
    share: float

    @property
    def devices(self) -> int:
        """a_{m,n}: devices this group takes (C3: dp x tp)."""
        return self.dp * self.tp


@dataclass
class Plan:
    """A placement: groups, the policy that chose it, and what the policy predicted."""

    policy: str
    groups: list[Group]
    predicted_e2e: float = float("nan")
    status: str = ""
    solve_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def allocation(self) -> dict[str, dict[str, int]]:
        """The allocation matrix A as {model: {device: count}}."""
        out: dict[str, dict[str, int]] = {}
        for g in self.groups:
            row = out.setdefault(g.model, {})
            row[g.device] = row.get(g.device, 0) + g.devices
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "policy": self.policy,
            "status": self.status,
            "solve_seconds": round(self.solve_seconds, 3),
            "predicted_mean_e2e_s": self.predicted_e2e,
            "allocation": self.allocation(),
            "groups": [g.__dict__ for g in self.groups],
            **self.extra,
        }


@dataclass
class Problem:
    """Models with workloads to place on a cluster, and the simulator tables that score candidates."""

    cluster: Cluster
    workloads: list[Workload]
    builder: TableBuilder = field(default_factory=TableBuilder)
    shares: int = 20
    """K: a model's traffic is split among device types in multiples of 1/K."""
    time_limit_s: float = 60.0

    def __post_init__(self) -> None:
        self.models: list[ModelSpec] = [load_model(w.model) for w in self.workloads]

    def device(self, name: str) -> Device:
        """The catalog entry of a device type."""
        return self.cluster.catalog[name]

    def options(self, index: int) -> list[tuple[str, int]]:
        """(device type, tp) pairs that can host model `index` at all (C2 per replica)."""
        w, m = self.workloads[index], self.models[index]
        return [
            (name, tp)
            for name, count in self.cluster.devices.items()
            for tp in (1, 2, 4, 8)
            if tp <= count and self.builder.fits(m, self.device(name), tp, w)
        ]

    def memory_need(self, index: int) -> float:
        """M_m: bytes of weights plus the KV cache of eight mean-length requests."""
        w, m, b = self.workloads[index], self.models[index], self.builder
        kv = 8 * (w.input.mean + w.output.mean) * m.kv_bytes_per_token(b.precision.kv_cache)
        return m.weight_bytes(b.precision.weights) + kv

    def prepare(self, progress: Progress | None = None) -> None:
        """Precompute every latency table the solver may consult."""
        jobs = [(i, name, tp) for i in range(len(self.workloads)) for name, tp in self.options(i)]
        total = max(len(jobs) * self.builder.settings.rate_points, 1)
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress:
                progress("simulating candidates", done / total)

        for i, name, tp in jobs:
            self.table(i, name, tp, on_eval=tick)

    def table(
        self, index: int, device: str, tp: int, on_eval: Callable[[], None] | None = None
    ) -> LatencyTable:
        """The latency table of model `index` on `tp` x `device`."""
        w = self.workloads[index]
        return self.builder.table(index, w, self.models[index], self.device(device), tp, w.rate, on_eval)

    def index_of(self, model: str) -> int:
        """Position of a model in the workload list."""
        for i, w in enumerate(self.workloads):
            if w.model == model or self.models[i].name == model:
                return i
        raise ConfigError(f"model {model!r} is not in the workload")

    def objective(self, plan: Plan) -> float:
        """Mean E2E over all requests, from the latency tables: sum of rate x share x latency over total rate."""
        total_rate = sum(w.rate for w in self.workloads)
        acc = 0.0
        for g in plan.groups:
            i = self.index_of(g.model)
            rate = self.workloads[i].rate * g.share
            if rate > 0:
                acc += rate * self.table(i, g.device, g.tp)(rate / g.dp)
        served = {self.index_of(g.model) for g in plan.groups if g.share > 0}
        if any(w.rate > 0 and i not in served for i, w in enumerate(self.workloads)):
            return float("inf")
        return acc / total_rate if total_rate else 0.0


def check_plan(problem: Problem, plan: Plan) -> list[str]:
    """Violations of C1 (capacity), C2 (memory) and C3 (a = DP x TP, TP within a node); empty when valid."""
    errors = []
    used: dict[str, int] = {}
    for g in plan.groups:
        used[g.device] = used.get(g.device, 0) + g.devices
    for name, count in used.items():
        if count > problem.cluster.devices.get(name, 0):
            errors.append(f"C1: {count} x {name} allocated, {problem.cluster.devices.get(name, 0)} available")
    for g in plan.groups:
        i = problem.index_of(g.model)
        dev = problem.device(g.device)
        if g.dp < 1 or g.tp < 1 or g.devices != g.dp * g.tp:
            errors.append(f"C3: {g} is not dp x tp")
        if g.tp > dev.devices_per_node:
            errors.append(f"C3: tp {g.tp} exceeds the {dev.devices_per_node} {g.device} of a node")
        if g.devices * dev.memory_bytes < problem.memory_need(i):
            errors.append(f"C2: {g.devices} x {g.device} cannot hold {g.model}")
        if not problem.builder.fits(problem.models[i], dev, g.tp, problem.workloads[i]):
            errors.append(f"C2: one replica of {g.model} does not fit on {g.tp} x {g.device}")
    return errors


def simulate_plan(problem: Problem, plan: Plan, duration: float = 30.0, seed: int = 1) -> dict[str, Any]:
    """Run the whole cluster under `plan` through the simulator: one trace, every replica, weighted routing."""
    rng = np.random.default_rng(seed)
    trace = poisson_trace(problem.workloads, duration, rng)
    specs: list[ReplicaSpec] = []
    groups = []
    for g in plan.groups:
        i = problem.index_of(g.model)
        spec = problem.builder.replica(problem.models[i], problem.device(g.device), g.tp)
        members = list(range(len(specs), len(specs) + g.dp))
        specs.extend([spec] * g.dp)
        groups.append((i, members, g.share))
    result = simulate(specs, trace, groups, rng)
    per_model = {}
    for i, w in enumerate(problem.workloads):
        sub = result.model == i
        part = type(result)(
            result.arrival[sub],
            result.first_token[sub],
            result.finish[sub],
            result.output_len[sub],
            result.model[sub],
        )
        per_model[w.model] = part.metrics()
    return {"duration_s": duration, "overall": result.metrics(), "per_model": per_model}


class PlacementPolicy(Protocol):
    """A placement policy: choose a plan for `problem`; report progress; stay within problem.time_limit_s."""

    name: str

    def place(self, problem: Problem, progress: Progress | None = None) -> Plan:
        """Return a plan satisfying C1-C3."""
        ...


POLICIES: Registry[type[PlacementPolicy]] = Registry(
    "placement policy",
    builtins=("opentela.scheduler.cpsat", "opentela.scheduler.memp"),
    entry_point_group="opentela.placement_policies",
)
register_policy = POLICIES.register


def get_policy(name: str) -> PlacementPolicy:
    """A policy by registered name (``cpsat``, ``memp``) or import path ``package.module:Class``."""
    return POLICIES.get(name)()


def shares_by_capacity(problem: Problem, groups: Sequence[tuple[str, str, int, int]]) -> list[Group]:
    """Groups (model, device, tp, dp) with each model's traffic split in proportion to replica throughput."""
    caps = [problem.table(problem.index_of(m), d, tp).capacity_rps * dp for m, d, tp, dp in groups]
    out = []
    for (m, d, tp, dp), cap in zip(groups, caps, strict=True):
        total = sum(c for (m2, *_), c in zip(groups, caps, strict=True) if m2 == m)
        out.append(Group(m, d, tp, dp, cap / total if total else 0.0))
    return out
