"""The llama.cpp adapter: its ``llama-server`` binary with a GGUF file or a Hugging Face repository."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from opentela.engines._registry import register_engine
from opentela.engines.advertised import (
    CONTEXT_LENGTH,
    DTYPE,
    ENGINE_VERSION,
    QUANTIZATION,
    TOOL_CALLS,
    clean_settings,
    dig,
    has_flag,
    last_flag,
    normalise_dtype,
    parse_count,
)
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

PROPS = "/props"
_MODEL_FLAGS = ("-m", "--model")
_HF_FLAGS = ("-hf", "-hfr", "--hf-repo")
_CTX_FLAGS = ("-c", "--ctx-size")
_PARALLEL_FLAGS = ("-np", "--parallel")
_UNIFIED_FLAGS = ("-kvu", "--kv-unified")
# The tag of ``-hf ORG/REPO:TAG`` when it names a GGUF quantization (Q4_K_M, IQ4_XS, TQ1_0) or an unquantized type.
_QUANT_TAG = re.compile(r"^(?:i?q\d\w*|tq\d\w*|mxfp4\w*|f16|bf16|f32)$", re.IGNORECASE)


def slot_context(ctx_size: Any, parallel: Any, unified: bool = False) -> int | None:
    """Tokens one request may hold: llama.cpp splits ``ctx_size`` across its ``parallel`` slots, unless the
    KV cache is unified (each slot may then grow to all of it). 0 or unknown: None (the model decides)."""
    total = parse_count(ctx_size)
    if total is None:
        return None
    slots = parse_count(parallel) if parallel is not None else None
    return total if unified or slots is None else (total // slots or None)


def props_settings(reports: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``GET /props``: the per-slot window ``default_generation_settings.n_ctx``, the build
    (``build_info``, e.g. ``b4567-1a2b3c4d``) and, where the build reports them, ``model_ftype`` and whether
    the chat template handles tools (``chat_template_caps.supports_tool_calls``)."""
    props = reports.get(PROPS)
    return clean_settings(
        {
            CONTEXT_LENGTH: dig(props, "default_generation_settings", "n_ctx"),
            ENGINE_VERSION: dig(props, "build_info"),
            QUANTIZATION: dig(props, "model_ftype"),
            TOOL_CALLS: dig(props, "chat_template_caps", "supports_tool_calls"),
        }
    )


def local_gguf(path: Any) -> str | None:
    """`path` when it names a GGUF file on this machine."""
    return path if isinstance(path, str) and path.endswith(".gguf") and os.path.isfile(path) else None


@register_engine()
class LlamacppEngine(Engine):
    """llama.cpp's ``llama-server`` (default port 8080 on loopback)."""

    name = "llamacpp"
    default_port = 8080
    ready_timeout = 900.0
    report_paths = (PROPS,)

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

    def launch_settings(self, argv: Sequence[str]) -> dict[str, Any]:
        """The per-slot window from ``-c``/``--ctx-size`` and ``-np``/``--parallel``, and the quantization a
        ``-hf ORG/REPO:Q4_K_M`` tag names (a local file's own header is read through `model_file`)."""
        argv = self._own_args(argv)
        out: dict[str, Any] = {}
        window = slot_context(
            last_flag(argv, _CTX_FLAGS), last_flag(argv, _PARALLEL_FLAGS), has_flag(argv, _UNIFIED_FLAGS)
        )
        if window is not None:
            out[CONTEXT_LENGTH] = window
        repo = last_flag(argv, _HF_FLAGS)
        tag = repo.rpartition(":")[2] if repo and ":" in repo else ""
        if _QUANT_TAG.match(tag):
            dtype = normalise_dtype(tag)
            out.update({DTYPE: dtype} if dtype in ("fp16", "bf16", "fp32") else {QUANTIZATION: tag})
        return clean_settings(out)

    def reported_settings(self, reports: Mapping[str, Any]) -> dict[str, Any]:
        """See `props_settings`; ``/v1/models`` adds ``meta.n_ctx`` per model."""
        return props_settings(reports)

    def model_file(self, argv: Sequence[str], reports: Mapping[str, Any]) -> str | None:
        """The ``-m FILE`` of the command, else the ``model_path`` ``/props`` names (a ``-hf`` download)."""
        given = last_flag(self._own_args(argv), _MODEL_FLAGS)
        return local_gguf(given) or local_gguf(dig(reports, PROPS, "model_path"))

    @staticmethod
    def _own_args(argv: Sequence[str]) -> Sequence[str]:
        # llama-server's arguments only: `srun -c 8 llama-server ...` gives the launcher's -c, not the context.
        i = program_index(argv, ("llama-server", "llama-server.exe"))
        return argv[i + 1 :] if i is not None else argv
