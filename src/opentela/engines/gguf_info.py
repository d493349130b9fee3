"""A GGUF file's own word on its weights: ``general.file_type`` read from the header, nothing else loaded.

`gguf.GGUFReader` parses every key and tensor, tokenizer arrays included (seconds for a 49k vocabulary on a small
CPU); a node only needs a couple of scalars near the start, so this walks the key/value section with plain reads,
skips arrays by their sizes, and stops as soon as it has what it wants. The value types and the file-type names
are the `gguf` package's.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Collection
from typing import Any, BinaryIO

from gguf import GGUF_MAGIC, GGUFValueType, LlamaFileType

from opentela.engines.advertised import DTYPE, QUANTIZATION, normalise_dtype, normalise_quantization

logger = logging.getLogger(__name__)

FILE_TYPE_KEY = "general.file_type"
_GUESSED = 1024
"""Bit llama.cpp sets on a file type it inferred from the tensors rather than was told."""
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
MAX_KEYS = 100_000
MAX_KEY_BYTES = 65_536
MAX_STRING_BYTES = 1 << 20


class _Truncated(Exception):
    pass


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise _Truncated
    return struct.unpack(fmt, data)[0]


def _skip(f: BinaryIO, kind: int, count: int = 1) -> None:
    if kind == GGUFValueType.STRING:
        for _ in range(count):
            f.seek(_read(f, "<Q"), os.SEEK_CUR)
    elif kind == GGUFValueType.ARRAY:
        for _ in range(count):
            inner, n = _read(f, "<I"), _read(f, "<Q")
            _skip(f, inner, n)
    elif kind in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[GGUFValueType(kind)]) * count, os.SEEK_CUR)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(path: str | os.PathLike[str], keys: Collection[str]) -> dict[str, Any]:
    """The scalar values of `keys` in a GGUF file's header (strings decoded); missing ones are left out.

    Raises OSError when the file cannot be read and ValueError when it is no GGUF file.
    """
    wanted = set(keys)
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        try:
            if _read(f, "<I") != GGUF_MAGIC:
                raise ValueError(f"{path} is not a GGUF file")
            version = _read(f, "<I")
            if version < 2:
                raise ValueError(f"{path}: GGUF version {version} is too old to read")
            _read(f, "<Q")  # tensor count
            n_keys = _read(f, "<Q")
            for _ in range(min(n_keys, MAX_KEYS)):
                if not wanted - out.keys():
                    break
                length = _read(f, "<Q")
                if length > MAX_KEY_BYTES:
                    raise ValueError(f"{path}: a GGUF key of {length} bytes")
                key = f.read(length).decode("utf-8", "replace")
                kind = _read(f, "<I")
                if key in wanted and kind in _SCALARS:
                    out[key] = _read(f, _SCALARS[GGUFValueType(kind)])
                elif key in wanted and kind == GGUFValueType.STRING:
                    size = _read(f, "<Q")
                    if size > MAX_STRING_BYTES:
                        raise ValueError(f"{path}: a GGUF string of {size} bytes")
                    out[key] = f.read(size).decode("utf-8", "replace")
                else:
                    _skip(f, kind)
        except (_Truncated, struct.error):
            pass  # a truncated header still gives what came before the cut
    return out


def file_type_settings(file_type: Any) -> dict[str, Any]:
    """``general.file_type`` as advertised settings: ``{"quantization": "q4_1"}``, or ``{"dtype": "fp16"}`` for
    unquantized weights; {} for a value the `gguf` package does not name."""
    if isinstance(file_type, bool) or not isinstance(file_type, int):
        return {}
    try:
        name = LlamaFileType(file_type & ~_GUESSED).name
    except ValueError:
        return {}
    bare = name.lower().removeprefix("mostly_").removeprefix("all_")
    dtype = normalise_dtype(bare)
    if dtype in ("fp16", "bf16", "fp32"):
        return {DTYPE: dtype}
    quantization = normalise_quantization(bare)
    return {QUANTIZATION: quantization} if quantization else {}


def gguf_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a GGUF model file says of its weights, or {} when it cannot be read (logged, never raised)."""
    try:
        meta = read_metadata(path, (FILE_TYPE_KEY,))
    except (OSError, ValueError) as exc:
        logger.info("cannot read the GGUF header of %s: %s", path, exc)
        return {}
    return file_type_settings(meta.get(FILE_TYPE_KEY))
