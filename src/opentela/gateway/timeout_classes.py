"""Timeout classes: per-model first-byte, idle and total timeouts and retry budgets at the ingress.

Reasoning models answer far later than others (the paper's section 6, Takeaway 6: P95 end-to-end latency
173.58 s against 30.77 s), so one set of timeouts either cuts their long answers off or leaves other models'
stuck requests waiting for minutes. A model gets a class by the first `model_classes` glob its id matches,
else `reasoning` when a replica advertises the setting ``reasoning = true``, else `default` (the gateway's own
timeouts).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentela.errors import ConfigError
from opentela.registry.record import NodeRecord

DEFAULT = "default"
REASONING = "reasoning"
REASONING_SETTING = "reasoning"
"""The model setting (an engine's `otela` object, copied into the record) that marks a reasoning model."""

# The built-in reasoning class scales the default class by the paper's P95 ratio (173.58 s / 30.77 s = 5.6)
# and rounds up: 300 s to first byte becomes 1800 s, 900 s in all becomes 5400 s. Its idle timeout is longer
# because a reasoning engine under KV-cache pressure preempts and recomputes long sequences (section 7.2),
# which pauses their streams. One retry, not two: a first-byte timeout has already cost up to half an hour.
REASONING_FIRST_BYTE_S = 1800.0
REASONING_IDLE_S = 300.0
REASONING_TOTAL_S = 5400.0
REASONING_MAX_RETRIES = 1


@dataclass(frozen=True, slots=True)
class TimeoutClass:
    """How long the ingress waits for one model's answers, and how many other replicas it tries."""

    name: str
    first_byte_timeout: float
    idle_timeout: float
    total_timeout: float
    max_retries: int

    def __post_init__(self) -> None:
        if min(self.first_byte_timeout, self.idle_timeout, self.total_timeout) <= 0:
            raise ConfigError(f"timeout class {self.name!r}: timeouts must be positive")
        if self.max_retries < 0:
            raise ConfigError(f"timeout class {self.name!r}: max_retries must be >= 0")


_NUMERIC = tuple(f.name for f in dataclasses.fields(TimeoutClass) if f.name != "name")


def builtin_reasoning(default: TimeoutClass) -> TimeoutClass:
    """The built-in `reasoning` class: never shorter than the default class, at most one retry."""
    return TimeoutClass(
        REASONING,
        max(REASONING_FIRST_BYTE_S, default.first_byte_timeout),
        max(REASONING_IDLE_S, default.idle_timeout),
        max(REASONING_TOTAL_S, default.total_timeout),
        min(REASONING_MAX_RETRIES, default.max_retries),
    )


def parse_timeout_classes(entries: Iterable[str], default: TimeoutClass) -> dict[str, TimeoutClass]:
    """The classes by name: `default`, the built-in `reasoning`, and `NAME: KEY=VALUE ...` entries.

    An entry's unnamed keys keep the values of the built-in class of that name, else of the default class.
    """
    classes = {DEFAULT: default, REASONING: builtin_reasoning(default)}
    for entry in entries:
        name, sep, rest = entry.partition(":")
        name = name.strip().lower()
        if not sep or not name:
            raise ConfigError(f"timeout_classes entries are `NAME: KEY=VALUE ...`, got {entry!r}")
        if name == DEFAULT:
            raise ConfigError(
                "the default timeout class is the gateway's own first_byte_timeout, idle_timeout, "
                "total_timeout and max_retries: set those instead of a `default:` entry"
            )
        values: dict[str, Any] = {}
        for pair in rest.split():
            key, eq, number = pair.partition("=")
            if not eq or key not in _NUMERIC:
                known = ", ".join(_NUMERIC)
                raise ConfigError(
                    f"timeout class {name!r}: {pair!r} is not KEY=VALUE with KEY one of {known}"
                )
            try:
                values[key] = int(number) if key == "max_retries" else float(number)
            except ValueError:
                raise ConfigError(f"timeout class {name!r}: {key} must be a number, got {number!r}") from None
        classes[name] = dataclasses.replace(classes.get(name, default), name=name, **values)
    return classes


def parse_model_classes(
    entries: Iterable[str], classes: Mapping[str, TimeoutClass]
) -> tuple[tuple[str, str], ...]:
    """`PATTERN=CLASS` entries as (lowercase glob, class name) pairs, in order; a ConfigError names a bad one."""
    out = []
    for entry in entries:
        pattern, sep, name = entry.rpartition("=")
        pattern, name = pattern.strip(), name.strip().lower()
        if not sep or not pattern or not name:
            raise ConfigError(f"model_classes entries are PATTERN=CLASS, got {entry!r}")
        if name not in classes:
            raise ConfigError(
                f"model_classes entry {entry!r} names the unknown timeout class {name!r} "
                f"(known: {', '.join(sorted(classes))})"
            )
        out.append((pattern.lower(), name))
    return tuple(out)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return value is True or (type(value) is int and value == 1)


def advertises_reasoning(record: NodeRecord, model: str) -> bool:
    """Whether the replica of `model` on `record` says it is a reasoning model."""
    return any(e.id == model and _truthy(e.settings.get(REASONING_SETTING)) for e in record.models)


class TimeoutClasses:
    """Resolves the timeout class of a request's model, from its id and what its replicas advertise."""

    def __init__(self, classes: Mapping[str, TimeoutClass], patterns: Sequence[tuple[str, str]] = ()) -> None:
        self.classes = dict(classes)
        self.default = self.classes[DEFAULT]
        self._patterns = tuple(patterns)
        self._by_pattern: dict[str, TimeoutClass | None] = {}
        """Pattern verdicts by model id; only ids that have replicas get here, so it stays small."""

    def __repr__(self) -> str:
        return f"<TimeoutClasses {sorted(self.classes)} patterns={len(self._patterns)}>"

    @classmethod
    def from_config(cls, config: Any) -> TimeoutClasses:
        """Built from a GatewayConfig's timeouts, `timeout_classes` and `model_classes`."""
        default = TimeoutClass(
            DEFAULT, config.first_byte_timeout, config.idle_timeout, config.total_timeout, config.max_retries
        )
        classes = parse_timeout_classes(config.timeout_classes, default)
        return cls(classes, parse_model_classes(config.model_classes, classes))

    def by_pattern(self, model: str) -> TimeoutClass | None:
        """The class of the first pattern `model` matches (case-insensitive), if any."""
        try:
            return self._by_pattern[model]
        except KeyError:
            pass
        lowered = model.lower()
        found = next((self.classes[n] for p, n in self._patterns if fnmatch.fnmatchcase(lowered, p)), None)
        self._by_pattern[model] = found
        return found

    def for_model(self, model: str, replicas: Sequence[NodeRecord]) -> TimeoutClass:
        """A pattern's class, else `reasoning` when a replica advertises it, else `default`."""
        found = self.by_pattern(model)
        if found is not None:
            return found
        if any(advertises_reasoning(r, model) for r in replicas):
            return self.classes[REASONING]
        return self.default
