"""The vLLM adapter: ``vllm serve MODEL`` or ``python -m vllm.entrypoints.openai.api_server``."""

from __future__ import annotations

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

# Option names accepted by `build`, as used in configs and controller templates, and vLLM's flags.
VLLM_OPTIONS = {
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "quantization": "--quantization",
    "dtype": "--dtype",
    "max_num_seqs": "--max-num-seqs",
    "served_model_name": "--served-model-name",
    "enforce_eager": "--enforce-eager",
    "trust_remote_code": "--trust-remote-code",
    "enable_prefix_caching": "--enable-prefix-caching",
    "api_key": "--api-key",
}


@register_engine()
class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server (default port 8000; binds all interfaces unless ``--host`` says so)."""

    name = "vllm"
    default_port = 8000
    ready_timeout = 1800.0

    def matches(self, argv: Sequence[str]) -> bool:
        """True for ``vllm serve ...`` and ``python -m vllm.entrypoints...``."""
        return program_index(argv, ("vllm",), then="serve") is not None or (
            module_index(argv, ("vllm.entrypoints",)) is not None
        )

    def build(
        self,
        model: str | None,
        port: int | None,
        *,
        executable: str = "vllm",
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        **options: Any,
    ) -> EngineSpec:
        """``vllm serve MODEL --host H --port P`` plus flags for the options in `VLLM_OPTIONS`."""
        if not model:
            raise ConfigError("the vllm engine needs a model, e.g. Qwen/Qwen3-1.7B")
        port = port or free_port()
        argv = [executable, "serve", model, "--host", host, "--port", str(port)]
        argv += options_to_flags(options, VLLM_OPTIONS, self.name)
        argv += list(extra_args)
        return self.spec(argv, port)
