"""The llama.cpp adapter: its ``llama-server`` binary with a GGUF file or a Hugging Face repository."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.base import Engine, EngineSpec, free_port, options_to_flags, program_index
from opentela.errors import ConfigError

# Option names accepted by `build`, and llama-server's flags.
LLAMACPP_OPTIONS = {
    "ctx_size": "--ctx-size",
    "max_model_len": "--ctx-size",
    "parallel": "--parallel",
    "threads": "--threads",
    "n_gpu_layers": "--n-gpu-layers",
    "tensor_split": "--tensor-split",
    "split_mode": "--split-mode",
    "alias": "--alias",
    "served_model_name": "--alias",
    "embeddings": "--embeddings",
    "metrics": "--metrics",
    "flash_attn": "--flash-attn",
    "api_key": "--api-key",
}


@register_engine()
class LlamacppEngine(Engine):
    """llama.cpp's ``llama-server`` (default port 8080 on loopback)."""

    name = "llamacpp"
    default_port = 8080
    ready_timeout = 900.0

    def matches(self, argv: Sequence[str]) -> bool:
        """True when the command runs ``llama-server``."""
        return program_index(argv, ("llama-server", "llama-server.exe")) is not None

    def build(
        self,
        model: str | None,
        port: int | None,
        *,
        executable: str = "llama-server",
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        **options: Any,
    ) -> EngineSpec:
        """``llama-server -m FILE`` (or ``-hf REPO[:QUANT]`` for a repository) on `port` with option flags."""
        if not model:
            raise ConfigError("the llamacpp engine needs a model: a .gguf file or a Hugging Face repo")
        port = port or free_port()
        # An existing file or anything that looks like a path is a local model; "org/repo" is a download.
        is_file = os.path.exists(model) or model.endswith(".gguf") or model.startswith(("/", "."))
        argv = [executable, "-m" if is_file else "-hf", model, "--host", host, "--port", str(port)]
        argv += options_to_flags(options, LLAMACPP_OPTIONS, self.name)
        argv += list(extra_args)
        return self.spec(argv, port)
