"""The SGLang adapter: ``python -m sglang.launch_server --model-path MODEL``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.base import (
    Engine,
    EngineSpec,
    free_port,
    module_index,
    options_to_flags,
    program_index,
)
from opentela.errors import ConfigError

# Option names accepted by `build`, and SGLang's flags.
SGLANG_OPTIONS = {
    "tensor_parallel_size": "--tp-size",
    "data_parallel_size": "--dp-size",
    "max_model_len": "--context-length",
    "context_length": "--context-length",
    "mem_fraction_static": "--mem-fraction-static",
    "gpu_memory_utilization": "--mem-fraction-static",
    "quantization": "--quantization",
    "dtype": "--dtype",
    "max_running_requests": "--max-running-requests",
    "served_model_name": "--served-model-name",
    "trust_remote_code": "--trust-remote-code",
    "api_key": "--api-key",
}


@register_engine()
class SglangEngine(Engine):
    """SGLang's server (default port 30000, loopback unless ``--host`` says otherwise)."""

    name = "sglang"
    default_port = 30000
    ready_timeout = 1800.0

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``python -m sglang.launch_server ...`` and ``sglang serve ...``."""
        return module_index(argv, ("sglang.launch_server",)) is not None or (
            program_index(argv, ("sglang",), then="serve") is not None
        )

    def build(
        self,
        model: str | None,
        port: int | None,
        *,
        python: str = sys.executable,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        **options: Any,
    ) -> EngineSpec:
        """``python -m sglang.launch_server --model-path MODEL --host H --port P`` plus option flags."""
        if not model:
            raise ConfigError("the sglang engine needs a model, e.g. Qwen/Qwen3-1.7B")
        port = port or free_port()
        argv = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            "--host",
            host,
            "--port",
            str(port),
        ]
        argv += options_to_flags(options, SGLANG_OPTIONS, self.name)
        argv += list(extra_args)
        return self.spec(argv, port)
