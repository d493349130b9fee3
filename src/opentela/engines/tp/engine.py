"""The tensor-parallel engine's adapter: how a node recognises and builds ``otela engine tp``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.base import (
    Engine,
    EngineSpec,
    free_port,
    runs_otela_engine,
)
from opentela.errors import ConfigError

_OPTIONS = {
    "ranks": "--ranks",
    "ffn_shards": "--ffn-shards",
    "threads": "--threads",
    "recovery": "--recovery",
    "weight_reload": "--weight-reload",
    "step_timeout": "--step-timeout",
    "max_tokens": "--max-tokens",
    "served_model_name": "--served-model-name",
}


@register_engine()
class TensorParallelEngine(Engine):
    """SmolLM2 (or another LLaMA-family GGUF) over local tensor-parallel rank processes that survive a rank loss."""

    name = "tp"
    default_port = None
    ready_timeout = 180.0

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``otela engine tp`` and ``python -m opentela engine tp``."""
        return runs_otela_engine(argv, "tp")

    def build(
        self,
        model: str | None = None,
        port: int | None = None,
        *,
        python: str = sys.executable,
        **options: Any,
    ) -> EngineSpec:
        """The command serving `model` (a GGUF path; None: the embedded SmolLM2) on `port` with engine options."""
        unknown = set(options) - set(_OPTIONS)
        if unknown:
            raise ConfigError(
                f"unknown options for the tp engine: {', '.join(sorted(unknown))}; known: {', '.join(sorted(_OPTIONS))}"
            )
        port = port or free_port()
        argv = [python, "-m", "opentela", "engine", "tp", "--port", str(port)]
        if model:
            argv += ["--model", model]
        for key, value in options.items():
            if value is not None:
                argv += [_OPTIONS[key], str(value)]
        return self.spec(argv, port)
