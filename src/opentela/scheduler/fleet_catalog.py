"""The fleet controller's catalog file: models to keep served, how nodes start them, their expected traffic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError
from opentela.scheduler.controller import ControllerConfig
from opentela.scheduler.drift import DriftRule
from opentela.scheduler.hardware import HardwareCatalog, load_catalog
from opentela.scheduler.models import BYTES_PER_ELEMENT, load_model
from opentela.scheduler.pipeline_control import PipelineModel, pipeline_model_from_gguf
from opentela.scheduler.serverless import ServerlessModel, instance_memory_mib
from opentela.scheduler.tables import SimSettings
from opentela.scheduler.workload import LengthDist, Workload

_MODEL_KEYS = {"id", "config", "command", "engine", "options", "workload", "serverless", "pipeline"}
_PIPELINE_KEYS = {"model_file", "concurrency", "input_len", "output_len", "memory_mib", "block_ms"}
_SERVERLESS_KEYS = {"keep_alive_s", "memory_mib", "weights", "l_min", "cold_start_timeout_s", "profile"}
_WORKLOAD_KEYS = {"rate", "input", "output", "observe"}
_PLANNING_KEYS = {
    "policy",
    "interval_s",
    "assign_timeout_s",
    "time_limit_s",
    "table_points",
    "sim_duration_s",
    "scale_out",
    "hardware",
    "usage_window_s",
    "usage_poll_s",
    "drift_rate",
    "drift_length",
    "drift_min_samples",
    "drift_cooldown_s",
}


@dataclass(frozen=True)
class CatalogModel:
    """One model of the catalog: the id nodes serve it as, its scheduler config, how to start it, its traffic."""

    id: str
    config: str
    launch: Mapping[str, Any]
    """``command`` (a template) or ``engine`` with ``options``: merged into the assign message."""
    workload: Workload
    """Declared traffic; `workload.model` is `config`, the name the placement knows the model by."""
    observe: bool = True
    """Use the ingress's observed request rate instead of the declared one once there is traffic."""
    serverless: ServerlessModel | None = None
    """Started on demand and recycled after a keep-alive, instead of kept served (scheduler/serverless.py)."""


@dataclass(frozen=True)
class FleetCatalog:
    """Everything `otela controller` reads from its catalog file."""

    models: Sequence[CatalogModel]
    pipelines: Sequence[PipelineModel] = ()
    """Split models kept covered by block servers (scheduler/pipeline_control.py)."""
    policy: str = "cpsat"
    interval_s: float = 30.0
    assign_timeout_s: float = 600.0
    time_limit_s: float = 60.0
    table_points: int = 8
    sim_duration_s: float = 10.0
    scale_out: bool = True
    hardware: HardwareCatalog | None = field(default=None, repr=False)
    usage_window_s: float = 3600.0
    """With a usage feed: seconds of recent requests each measurement covers."""
    usage_poll_s: float = 60.0
    """With a usage feed: seconds between two measurements."""
    drift: DriftRule = field(default_factory=DriftRule)

    @property
    def kept(self) -> list[CatalogModel]:
        """The models kept served by the fleet controller's rounds (every one not serverless)."""
        return [m for m in self.models if m.serverless is None]

    @property
    def serverless(self) -> dict[str, ServerlessModel]:
        """The serverless models by the id clients request them as."""
        return {m.id: m.serverless for m in self.models if m.serverless is not None}

    def controller_config(self, interval_s: float | None = None) -> ControllerConfig:
        """The controller's settings for the kept models (`interval_s` overrides the file's)."""
        return ControllerConfig(
            workloads=[m.workload for m in self.kept],
            engine="",
            policy=self.policy,
            interval_s=self.interval_s if interval_s is None else interval_s,
            assign_timeout_s=self.assign_timeout_s,
            time_limit_s=self.time_limit_s,
            settings=SimSettings(
                horizon_s=self.sim_duration_s,
                min_requests=60,
                max_requests=600,
                rate_points=self.table_points,
            ),
            served_as={m.config: m.id for m in self.models},
            launch={m.config: m.launch for m in self.models},
            scale_out=self.scale_out,
            drift=self.drift,
        )


def _number(raw: Mapping[str, Any], key: str, where: str, default: float, positive: bool = True) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}: {key} must be positive, got {value!r}")
    return float(value)


def _pipeline(raw: Mapping[str, Any], where: str, base: Path) -> PipelineModel:
    """A model entry with a `pipeline:` section: split across block servers by the controller."""
    model_id = raw.get("id")
    if not isinstance(model_id, str) or not model_id:
        raise ConfigError(f"{where}: 'id' (the model id block servers announce) is required")
    extra = set(raw) - {"id", "pipeline"}
    if extra:
        raise ConfigError(f"{where}: a pipeline model takes only 'id' and 'pipeline', not {sorted(extra)}")
    section = raw["pipeline"] if raw["pipeline"] is not True else {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}.pipeline: expected true or a mapping of {sorted(_PIPELINE_KEYS)}")
    unknown = set(section) - _PIPELINE_KEYS
    if unknown:
        raise ConfigError(
            f"{where}.pipeline: unknown fields {sorted(unknown)}; known: {sorted(_PIPELINE_KEYS)}"
        )
    w = f"{where}.pipeline"
    if section.get("model_file"):
        path = base / str(section["model_file"])
    else:
        from opentela.model.locate import SMOLLM2_ID, default_model_path

        if model_id != SMOLLM2_ID:
            raise ConfigError(f"{w}: model_file (the model's GGUF file) is required for {model_id}")
        path = default_model_path()
    if not path.is_file():
        raise ConfigError(f"{w}: model_file {path} does not exist")
    memory = section.get("memory_mib")
    block_ms = section.get("block_ms")
    try:
        return pipeline_model_from_gguf(
            model_id,
            str(path),
            concurrency=int(_number(section, "concurrency", w, 4)),
            input_len=int(_number(section, "input_len", w, 512)),
            output_len=int(_number(section, "output_len", w, 512)),
            memory_mib=None if memory is None else int(_number(section, "memory_mib", w, 1)),
            block_ms=None if block_ms is None else _number(section, "block_ms", w, 1.0),
        )
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{w}: cannot read {path} as a GGUF model: {exc}") from None


def _model(raw: Any, where: str, base: Path) -> CatalogModel:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with id, command (or engine) and workload")
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(_MODEL_KEYS)}")
    model_id = raw.get("id")
    if not isinstance(model_id, str) or not model_id:
        raise ConfigError(f"{where}: 'id' (the model id nodes serve and clients request) is required")
    config = str(raw.get("config") or model_id)
    if (base / config).exists():
        config = str(base / config)  # a config.json path relative to the catalog file
    try:
        load_model(config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: config {config!r}: {exc}") from None
    command, engine = raw.get("command"), raw.get("engine")
    if (command is None) == (engine is None):
        raise ConfigError(f"{where}: give either 'command' (a template) or 'engine' (an adapter name)")
    if command is not None:
        if not (
            isinstance(command, str)
            or (isinstance(command, list) and all(isinstance(a, str) for a in command))
        ):
            raise ConfigError(f"{where}: 'command' must be a string or a list of strings")
        launch: dict[str, Any] = {"command": command}
    else:
        options = raw.get("options", {})
        if not isinstance(engine, str) or not isinstance(options, Mapping):
            raise ConfigError(f"{where}: 'engine' must be a name and 'options' a mapping")
        launch = {"engine": engine, "options": dict(options)}
    workload = raw.get("workload", {"rate": 0} if "serverless" in raw else None)
    if not isinstance(workload, Mapping) or "rate" not in workload:
        raise ConfigError(f"{where}: 'workload' needs at least a rate (requests per second)")
    unknown = set(workload) - _WORKLOAD_KEYS
    if unknown:
        raise ConfigError(
            f"{where}.workload: unknown fields {sorted(unknown)}; known: {sorted(_WORKLOAD_KEYS)}"
        )
    rate = _number(workload, "rate", f"{where}.workload", 0.0, positive=False)
    if rate < 0:
        raise ConfigError(f"{where}.workload: rate must be >= 0")
    work = Workload(
        config,
        rate,
        LengthDist.parse(workload.get("input", 512), f"{where}.workload.input"),
        LengthDist.parse(workload.get("output", 256), f"{where}.workload.output"),
    )
    serverless = None
    if "serverless" in raw:
        serverless = _serverless(
            raw["serverless"], f"{where}.serverless", model_id, config, launch, work, base
        )
    return CatalogModel(
        id=model_id,
        config=config,
        launch=launch,
        workload=work,
        observe=bool(workload.get("observe", True)),
        serverless=serverless,
    )


def _serverless(
    raw: Any, where: str, model_id: str, config: str, launch: Mapping[str, Any], work: Workload, base: Path
) -> ServerlessModel:
    """A model's `serverless:` section (true, or a mapping of its settings)."""
    if raw is True:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected true or a mapping of {sorted(_SERVERLESS_KEYS)}")
    unknown = set(raw) - _SERVERLESS_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(_SERVERLESS_KEYS)}")
    if "memory_mib" in raw:
        memory = int(_number(raw, "memory_mib", where, 1))
    else:
        # Eq. 2 of LLM-Mesh at one request, from the model's shape and its declared lengths.
        spec = load_model(config)
        weights = str(raw.get("weights", "fp16"))
        if weights not in BYTES_PER_ELEMENT:
            raise ConfigError(f"{where}: weights {weights!r} unknown; known: {', '.join(BYTES_PER_ELEMENT)}")
        memory = instance_memory_mib(
            spec.weight_bytes(weights),
            spec.kv_bytes_per_token(),
            work.input.mean,
            work.output.mean,
            _number(raw, "l_min", where, float(spec.max_positions)),
        )
    profile = ""
    if raw.get("profile"):
        profile = PerformanceProfile.load(base / str(raw["profile"])).profile_id
    return ServerlessModel(
        id=model_id,
        launch=launch,
        profile=profile,
        memory_mib=memory,
        keep_alive_s=_number(raw, "keep_alive_s", where, 60.0),
        cold_start_timeout_s=_number(raw, "cold_start_timeout_s", where, 300.0),
    )


def parse_fleet_catalog(raw: Any, where: str = "<catalog>", base: Path | None = None) -> FleetCatalog:
    """A catalog from its parsed YAML: ``models: [...]`` and an optional ``planning:`` section."""
    base = base or Path.cwd()
    if not isinstance(raw, Mapping) or not isinstance(raw.get("models"), list) or not raw["models"]:
        raise ConfigError(f"{where}: expected a non-empty list under 'models'")
    unknown = set(raw) - {"models", "planning"}
    if unknown:
        raise ConfigError(f"{where}: unknown sections {sorted(unknown)}; known: models, planning")
    pipelines = [
        _pipeline(m, f"{where}: models[{i}]", base)
        for i, m in enumerate(raw["models"])
        if isinstance(m, Mapping) and "pipeline" in m
    ]
    models = [
        _model(m, f"{where}: models[{i}]", base)
        for i, m in enumerate(raw["models"])
        if not (isinstance(m, Mapping) and "pipeline" in m)
    ]
    for key in ("id", "config"):
        seen: set[str] = set()
        # Placement knows kept models by their config; serverless ones may share one.
        for m in models if key == "id" else [m for m in models if m.serverless is None]:
            if getattr(m, key) in seen:
                raise ConfigError(
                    f"{where}: two models share the {key} {getattr(m, key)!r}"
                    + ("; give each its own config.json" if key == "config" else "")
                )
            seen.add(getattr(m, key))
    planning = raw.get("planning") or {}
    if not isinstance(planning, Mapping):
        raise ConfigError(f"{where}: 'planning' must be a mapping")
    unknown = set(planning) - _PLANNING_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: planning: unknown fields {sorted(unknown)}; known: {sorted(_PLANNING_KEYS)}"
        )
    p = f"{where}: planning"
    hardware = None
    if planning.get("hardware"):
        path = base / str(planning["hardware"])
        try:
            hardware = load_catalog(path)
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read hardware file {path}: {exc}") from None
    cooldown = _number(planning, "drift_cooldown_s", p, 600.0, positive=False)
    if cooldown < 0:
        raise ConfigError(f"{p}: drift_cooldown_s must be >= 0, got {cooldown!r}")
    drift = DriftRule(
        rate=_number(planning, "drift_rate", p, 0.3),
        length=_number(planning, "drift_length", p, 0.5),
        min_samples=int(_number(planning, "drift_min_samples", p, 30)),
        cooldown_s=cooldown,
    )
    ids = [m.id for m in models] + [p.id for p in pipelines]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: two models share an id")
    return FleetCatalog(
        models=models,
        pipelines=pipelines,
        policy=str(planning.get("policy", "cpsat")),
        interval_s=_number(planning, "interval_s", p, 30.0),
        assign_timeout_s=_number(planning, "assign_timeout_s", p, 600.0),
        time_limit_s=_number(planning, "time_limit_s", p, 60.0),
        table_points=int(_number(planning, "table_points", p, 8)),
        sim_duration_s=_number(planning, "sim_duration_s", p, 10.0),
        scale_out=bool(planning.get("scale_out", True)),
        hardware=hardware,
        usage_window_s=_number(planning, "usage_window_s", p, 3600.0),
        usage_poll_s=_number(planning, "usage_poll_s", p, 60.0),
        drift=drift,
    )


def load_fleet_catalog(path: str | Path) -> FleetCatalog:
    """Read and check a catalog file (YAML or JSON)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read catalog {path}: {exc}") from None
    return parse_fleet_catalog(raw, str(path), path.parent)
