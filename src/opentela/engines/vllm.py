"""The vLLM adapter: ``vllm serve MODEL`` or ``python -m vllm.entrypoints.openai.api_server``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.advertised import (
    CONTEXT_LENGTH,
    DATA_PARALLEL,
    DTYPE,
    ENGINE_VERSION,
    PIPELINE_PARALLEL,
    QUANTIZATION,
    TENSOR_PARALLEL,
    clean_settings,
    dig,
    flag_settings,
)
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

# Where `vllm serve` takes each advertised setting from (its argparse spellings, short ones included).
VLLM_SETTING_FLAGS = {
    QUANTIZATION: ("--quantization", "-q"),
    DTYPE: ("--dtype",),
    TENSOR_PARALLEL: ("--tensor-parallel-size", "-tp"),
    PIPELINE_PARALLEL: ("--pipeline-parallel-size", "-pp"),
    DATA_PARALLEL: ("--data-parallel-size", "-dp"),
    CONTEXT_LENGTH: ("--max-model-len",),
}


@register_engine()
class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server (default port 8000; binds all interfaces unless ``--host`` says so)."""

    name = "vllm"
    default_port = 8000
    ready_timeout = 1800.0
    native_responses = True
    report_paths = ("/version",)

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

    def launch_settings(self, argv: Sequence[str]) -> dict[str, Any]:
        """Quantization, dtype, parallel sizes and ``--max-model-len`` from the command (``auto`` says nothing)."""
        return flag_settings(self._own_args(argv), VLLM_SETTING_FLAGS)

    @staticmethod
    def _own_args(argv: Sequence[str]) -> Sequence[str]:
        # vLLM's arguments only: a launcher in front (`srun -q QOS`) has flags of its own.
        i = program_index(argv, ("vllm",), then="serve")
        if i is None:
            i = module_index(argv, ("vllm.entrypoints",))
        return argv[i + 1 :] if i is not None else argv

    def reported_settings(self, reports: Mapping[str, Any]) -> dict[str, Any]:
        """``GET /version`` answers ``{"version": "0.8.5"}``; ``max_model_len`` comes with each /v1/models entry.

        vLLM's API says nothing of its quantization, dtype or parallel sizes: those come from the command line.
        """
        return clean_settings({ENGINE_VERSION: dig(reports, "/version", "version")})
