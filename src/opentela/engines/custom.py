"""The fallback adapter for any other command that serves the OpenAI API on a local port."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.base import Engine, EngineSpec, as_argv, find_flag
from opentela.errors import ConfigError


@register_engine()
class CustomEngine(Engine):
    """Any OpenAI-compatible server: the port comes from ``--port N`` in the command or is given explicitly.

    A ``{port}`` placeholder in the command (``my-server --listen 127.0.0.1:{port}``) is replaced by the
    given port or by a free one, and ``{model}`` by the model in `build`.
    """

    name = "custom"
    default_port = None
    port_flag = "--port"
    ready_timeout = 900.0

    def matches(self, argv: Sequence[str]) -> bool:
        """The fallback matches nothing by itself; `engine_from_command` uses it last."""
        return False

    def from_command(self, argv: str | Sequence[str], port: int | None = None) -> EngineSpec:
        """Wrap the command; unlike known engines, we cannot add a port flag it may not understand."""
        args = as_argv(argv)
        found = find_flag(args, "--port")
        templated = any("{port}" in a for a in args)
        if not templated and not port and found is None:
            raise ConfigError(
                f"cannot tell which port `{' '.join(args)}` serves the OpenAI API on: add `--port N` to the "
                "command, put a {port} placeholder in it, or give the port explicitly (--engine-port N)"
            )
        if not templated and not found and port:
            # The explicit port is only a promise about where the command listens; trust it as given.
            return self.spec(args, port)
        return super().from_command(args, port)

    def build(
        self,
        model: str | None,
        port: int | None,
        *,
        command: str | Sequence[str] | None = None,
        health_path: str | None = None,
        **options: Any,
    ) -> EngineSpec:
        """Wrap `command` (a template with optional ``{model}`` and ``{port}``); other options are errors."""
        if options:
            raise ConfigError(f"unknown options for the custom engine: {', '.join(sorted(options))}")
        if command is None:
            raise ConfigError("the custom engine needs a command, e.g. command='my-server --port {port}'")
        args = [a.replace("{model}", model or "") for a in as_argv(command)]
        spec = self.from_command(args, port)
        if health_path:
            spec = dataclasses.replace(spec, health_path=health_path)
        return spec
