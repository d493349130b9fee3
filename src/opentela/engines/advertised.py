"""What an engine advertises: the settings a node publishes for its models, normalised so constraints compare them.

Each adapter reads two sources (`Engine.launch_settings` from the command line the node launched, and
`Engine.reported_settings` from the engine's own answers); this module holds the shared vocabulary: the
setting names, how values are normalised, how flags are read, and how the two sources are merged. Nothing here
does I/O; every parser takes what it is given and drops what it cannot read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

QUANTIZATION = "quantization"
"""Weight quantization, lower-case (``q4_1``, ``awq``, ``gptq``, ``fp8``); absent when unquantized or unknown."""
DTYPE = "dtype"
"""Activation/weight dtype of an unquantized model: ``bf16``, ``fp16`` or ``fp32``."""
TENSOR_PARALLEL = "tensor_parallel_size"
PIPELINE_PARALLEL = "pipeline_parallel_size"
DATA_PARALLEL = "data_parallel_size"
CONTEXT_LENGTH = "context_length"
"""Tokens one request may hold (vLLM's ``max_model_len``, SGLang's context length, llama.cpp's per-slot
``n_ctx``)."""
ENGINE_VERSION = "engine_version"
TOOL_CALLS = "tool_calls"
"""Whether the engine turns a chat request's `tools` into tool calls: false where llama.cpp reports that the
model's chat template has no tool support (it then ignores `tools`); absent when the engine does not say."""

ADVERTISED_KEYS = (
    QUANTIZATION,
    DTYPE,
    TENSOR_PARALLEL,
    PIPELINE_PARALLEL,
    DATA_PARALLEL,
    CONTEXT_LENGTH,
    ENGINE_VERSION,
    TOOL_CALLS,
)
_COUNT_KEYS = frozenset({TENSOR_PARALLEL, PIPELINE_PARALLEL, DATA_PARALLEL, CONTEXT_LENGTH})
MAX_COUNT = 2**31
MAX_NAME = 64

_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "f16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "f32": "fp32",
}
_NOT_A_VALUE = frozenset({"", "auto", "none", "null", "default", "unknown"})
_QUANT_ALIASES = {
    "awq_marlin": "awq",
    "gptq_marlin": "gptq",
    "gptq_marlin_24": "gptq",
    "marlin": "gptq",
    "fbgemm_fp8": "fp8",
    "ptpc_fp8": "fp8",
    "w8a8_fp8": "fp8",
    "w8a8_int8": "int8",
    "bnb": "bitsandbytes",
}
_GGUF_PREFIX = re.compile(r"^(?:mostly|all)_")
_GGUF_SUFFIX = re.compile(r"_some_f16$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.+-]*$")
_COUNT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")


def normalise_dtype(value: Any) -> str | None:
    """``bfloat16`` -> ``bf16``, ``float16``/``half`` -> ``fp16``, ``float32`` -> ``fp32``; ``auto`` and
    anything unreadable -> None. Other short names (``fp8``) are kept lower-case."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower().removeprefix("torch.")
    if text in _NOT_A_VALUE:
        return None
    if text in _DTYPES:
        return _DTYPES[text]
    return text if len(text) <= MAX_NAME and _NAME.match(text) else None


def normalise_quantization(value: Any) -> str | None:
    """A quantization method's name, lower-case: ``Q4_1`` and ``MOSTLY_Q4_1`` -> ``q4_1``, ``awq_marlin`` ->
    ``awq``; None for unquantized (``none``) and for anything unreadable. An unquantized dtype given as the
    quantization (a GGUF ``F16`` file) is also None: it says the weights are not quantized."""
    if not isinstance(value, str):
        return None
    text = _GGUF_SUFFIX.sub("", _GGUF_PREFIX.sub("", value.strip().lower()))
    if text in _NOT_A_VALUE or text in _DTYPES:
        return None
    text = _QUANT_ALIASES.get(text, text)
    return text if len(text) <= MAX_NAME and _NAME.match(text) else None


def parse_count(value: Any) -> int | None:
    """A positive integer from an int or a command-line string (``4096``, ``32k`` = 32000, ``32K`` = 32768, as
    vLLM reads them); None for anything else, zero, negatives and absurd sizes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        match = _COUNT.match(value.strip())
        if not match:
            return None
        suffix = match.group(2)
        if not suffix and "." in match.group(1):
            return None
        scale = 1024 ** " KMG".index(suffix) if suffix.isupper() else 1000 ** " kmg".index(suffix or " ")
        number = int(float(match.group(1)) * scale)
    else:
        return None
    return number if 0 < number < MAX_COUNT else None


def normalise_version(value: Any) -> str | None:
    """A version string as the engine gives it (``0.8.5``, ``b4567-1a2b3c``), trimmed; None when unknown."""
    if not isinstance(value, str):
        return None
    text = value.strip().removeprefix("v")
    if text.lower() in _NOT_A_VALUE or text.startswith("b0-") or not 0 < len(text) <= MAX_NAME:
        return None
    return text if text.isprintable() else None


def clean_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Only the advertised keys whose values normalise; None and unreadable values are dropped."""
    out: dict[str, Any] = {}
    for key in ADVERTISED_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if key == QUANTIZATION:
            value = normalise_quantization(value)
        elif key == DTYPE:
            value = normalise_dtype(value)
        elif key == ENGINE_VERSION:
            value = normalise_version(value)
        elif key in _COUNT_KEYS:
            value = parse_count(value)
        elif key == TOOL_CALLS:
            value = value if type(value) is bool else None
        if value is not None:
            out[key] = value
    return out


def merge_settings(
    launched: Mapping[str, Any], reported: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    """What the node publishes, and the disagreements: the command line wins over the engine's report.

    Both are cleaned first; a key both give with different values is a disagreement (key, launched, reported).
    Versions are not compared: a launcher names a package release where the engine names its build.
    """
    launched, reported = clean_settings(launched), clean_settings(reported)
    mismatches = [
        (k, v, reported[k])
        for k, v in launched.items()
        if k in reported and reported[k] != v and k != ENGINE_VERSION
    ]
    return {**reported, **launched}, mismatches


def last_flag(argv: Sequence[str], flags: Iterable[str]) -> str | None:
    """The value of the last of any of `flags` (``-tp 2``, ``--tensor-parallel-size=2``): later ones win, as in
    argparse, whichever spelling they use."""
    names = tuple(flags)
    value: str | None = None
    for i, tok in enumerate(argv):
        if tok in names and i + 1 < len(argv):
            value = argv[i + 1]
        else:
            for name in names:
                if name.startswith("--") and tok.startswith(name + "="):
                    value = tok[len(name) + 1 :]
    return value


def has_flag(argv: Sequence[str], flags: Iterable[str]) -> bool:
    """True when any of the boolean `flags` appears."""
    names = set(flags)
    return any(tok in names for tok in argv)


def flag_settings(argv: Sequence[str], table: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Settings read from the command line through a ``setting -> flag spellings`` table, cleaned."""
    found = {key: last_flag(argv, flags) for key, flags in table.items()}
    return clean_settings({k: v for k, v in found.items() if v is not None})


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...`` through JSON objects, or None where any step is missing or not an object."""
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj
