"""The engine registry, and lookups of an engine by its serving command or by name."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentela.engines.base import Engine, EngineSpec, as_argv
from opentela.errors import ConfigError
from opentela.plugins import Registry

log = logging.getLogger(__name__)

ENGINES: Registry[type[Engine]] = Registry(
    "engine",
    builtins=(
        "opentela.engines.embedded",
        "opentela.engines.simulated",
        "opentela.engines.tp.engine",
        "opentela.engines.vllm",
        "opentela.engines.sglang",
        "opentela.engines.llamacpp",
        "opentela.engines.custom",
    ),
    entry_point_group="opentela.engines",
)

register_engine = ENGINES.register


def engine_adapter(name: str) -> Engine:
    """The adapter registered under `name` (``vllm``, ``sglang``, ``llamacpp``, ``embedded``, ...)."""
    return ENGINES.get(name)()


def engine_from_command(argv: str | Sequence[str], port: int | None = None) -> EngineSpec:
    """Wrap a serving command: the first adapter that recognises it, else the generic ``custom`` one.

    `port` None or 0 lets the adapter find the port in the command or pick a free one; ``custom``
    commands must name their port with ``--port N`` or be given it explicitly.
    """
    args = as_argv(argv)
    if not args:
        raise ConfigError("no engine command given")
    for name in ENGINES.names():
        if name == "custom":
            continue
        adapter = engine_adapter(name)
        if adapter.matches(args):
            log.debug("command %r recognised as engine %s", args, name)
            return adapter.from_command(args, port)
    return engine_adapter("custom").from_command(args, port)


def engine_from_name(
    name: str, model: str | None = None, port: int | None = None, **options: Any
) -> EngineSpec:
    """The command for a shorthand such as ``--engine embedded`` or a controller's template."""
    return engine_adapter(name).build(model, port, **options)
