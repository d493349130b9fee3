"""The configuration tree: defaults, then a TOML/YAML file, then OTELA_* variables, then command-line flags."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentela._logging import LogConfig
from opentela.errors import ConfigError
from opentela.fabric._config import FabricConfig
from opentela.frontend._config import FrontendConfig
from opentela.gateway._config import GatewayConfig
from opentela.node._config import NodeConfig
from opentela.registry._config import RegistryConfig


@dataclass(frozen=True)
class OtelaConfig:
    """Everything a node reads at start-up: one section per layer, and how the process logs."""

    node: NodeConfig = field(default_factory=NodeConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    log: LogConfig = field(default_factory=LogConfig)


def config_home(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/opentela (or ~/.config/opentela)."""
    env = os.environ if env is None else env
    return Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "opentela"


def state_home(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/opentela (or ~/.local/state/opentela)."""
    env = os.environ if env is None else env
    return Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "opentela"


def data_home(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_DATA_HOME/opentela (or ~/.local/share/opentela): the frontend's database and admin token."""
    env = os.environ if env is None else env
    return Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "opentela"


def iter_fields(cls: type = OtelaConfig) -> Iterator[tuple[str, dataclasses.Field, type]]:
    """(section, field, field type) for every leaf setting."""
    hints = typing.get_type_hints(cls)
    for section in dataclasses.fields(cls):
        section_cls = hints[section.name]
        section_hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            yield section.name, f, section_hints[f.name]


def env_name(section: str, name: str) -> str:
    """The environment variable of a setting, e.g. OTELA_GATEWAY_MAX_BODY_BYTES."""
    return f"OTELA_{section}_{name}".upper()


def _coerce(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    try:
        if origin in (tuple, list):
            items = (
                [s.strip() for s in value.split(",") if s.strip()] if isinstance(value, str) else list(value)
            )
            return tuple(str(i) for i in items)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(typ) if a is not type(None)]
            return None if value in (None, "") else _coerce(value, inner[0], where)
        if typ is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if typ in (int, float, str):
            if typ is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: cannot read {value!r} as {getattr(typ, '__name__', typ)}") from None
    return value


def read_file(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Parse a TOML (.toml) or YAML (.yaml/.yml) configuration file into sections."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except Exception as exc:
        raise ConfigError(
            f"{path} is not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'TOML'}: {exc}"
        ) from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"{path}: expected sections like [node] and [gateway] holding settings")
    return data


def load_config(
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> OtelaConfig:
    """Build the tree; `flags` holds only the settings given on the command line, by section."""
    env = os.environ if env is None else env
    from_file = read_file(file) if file else {}
    known = {(s, f.name) for s, f, _ in iter_fields()}
    for section, values in from_file.items():
        for name in values:
            if (section, name) not in known:
                raise ConfigError(f"unknown setting [{section}] {name} in {file}")
    sections: dict[str, dict[str, Any]] = {}
    for section, f, typ in iter_fields():
        where = f"[{section}] {f.name}"
        value: Any = dataclasses.MISSING
        if flags and f.name in flags.get(section, {}):
            value, where = flags[section][f.name], f"--{f.name.replace('_', '-')}"
        elif env_name(section, f.name) in env:
            value, where = env[env_name(section, f.name)], env_name(section, f.name)
        elif f.name in from_file.get(section, {}):
            value = from_file[section][f.name]
        if value is not dataclasses.MISSING:
            sections.setdefault(section, {})[f.name] = _coerce(value, typ, where)
    hints = typing.get_type_hints(OtelaConfig)
    return OtelaConfig(**{name: hints[name](**values) for name, values in sections.items()})


def reference_markdown() -> str:
    """The configuration reference page (docs/configuration.md), generated from the field metadata."""
    lines = [
        "# Configuration reference",
        "",
        "Every setting can be given, from lowest to highest precedence, as its default, in a configuration file",
        "(`--config FILE`, TOML or YAML, one table per section), as an environment variable, or as a command-line",
        "flag where `otela start` has one. Lists are comma-separated in variables. This page is generated by",
        "`otela config reference`; a test keeps it in step with the code.",
        "",
    ]
    current = None
    defaults = {s.name: getattr(OtelaConfig(), s.name) for s in dataclasses.fields(OtelaConfig)}
    for section, f, _ in iter_fields():
        if section != current:
            current = section
            lines += [
                "",
                f"## [{section}]",
                "",
                "| setting | default | variable | meaning |",
                "|---|---|---|---|",
            ]
        default = getattr(defaults[section], f.name)
        shown = ", ".join(default) if isinstance(default, tuple) else default
        lines.append(
            f"| `{f.name}` | `{shown!s}` | `{env_name(section, f.name)}` | {f.metadata.get('help', '')} |"
        )
    return "\n".join(lines) + "\n"
