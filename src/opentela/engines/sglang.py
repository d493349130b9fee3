"""The SGLang adapter: ``python -m sglang.launch_server --model-path MODEL``."""

from __future__ import annotations

import os
import sys
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
    last_flag,
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

# Where `sglang.launch_server` takes each advertised setting from (its argparse spellings).
SGLANG_SETTING_FLAGS = {
    QUANTIZATION: ("--quantization",),
    DTYPE: ("--dtype",),
    TENSOR_PARALLEL: ("--tp-size", "--tensor-parallel-size", "--tp"),
    PIPELINE_PARALLEL: ("--pp-size", "--pipeline-parallel-size"),
    DATA_PARALLEL: ("--dp-size", "--data-parallel-size", "--dp"),
    CONTEXT_LENGTH: ("--context-length",),
}
SERVER_INFO = "/get_server_info"
MODEL_INFO = "/get_model_info"
# What /get_server_info calls each setting (it flattens the server's arguments into its answer).
_SERVER_INFO_KEYS = {
    QUANTIZATION: "quantization",
    DTYPE: "dtype",
    TENSOR_PARALLEL: "tp_size",
    PIPELINE_PARALLEL: "pp_size",
    DATA_PARALLEL: "dp_size",
    CONTEXT_LENGTH: "context_length",
    ENGINE_VERSION: "version",
}


@register_engine()
class SglangEngine(Engine):
    """SGLang's server (default port 30000, loopback unless ``--host`` says otherwise)."""

    name = "sglang"
    default_port = 30000
    ready_timeout = 1800.0
    report_paths = (SERVER_INFO, MODEL_INFO)

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

    def launch_settings(self, argv: Sequence[str]) -> dict[str, Any]:
        """Quantization, dtype, ``--tp-size``, ``--pp-size``, ``--dp-size`` and ``--context-length``."""
        return flag_settings(self._own_args(argv), SGLANG_SETTING_FLAGS)

    @staticmethod
    def _own_args(argv: Sequence[str]) -> Sequence[str]:
        # SGLang's arguments only: a launcher in front has flags of its own.
        i = module_index(argv, ("sglang.launch_server",))
        if i is None:
            i = program_index(argv, ("sglang",), then="serve")
        return argv[i + 1 :] if i is not None else argv

    def reported_settings(self, reports: Mapping[str, Any]) -> dict[str, Any]:
        """``/get_server_info`` carries the server's arguments (``tp_size``, ``quantization``, ``dtype``,
        ``context_length``...: null where left to the model) and ``version``."""
        info = reports.get(SERVER_INFO)
        return clean_settings({key: dig(info, name) for key, name in _SERVER_INFO_KEYS.items()})

    def model_file(self, argv: Sequence[str], reports: Mapping[str, Any]) -> str | None:
        """A GGUF file given as the model (SGLang loads those too), from the command or ``/get_model_info``."""
        given = last_flag(self._own_args(argv), ("--model-path", "--model"))
        for path in (given, dig(reports, MODEL_INFO, "model_path")):
            if isinstance(path, str) and path.endswith(".gguf") and os.path.isfile(path):
                return path
        return None
