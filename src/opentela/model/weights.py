"""Reading a GGUF file: metadata fields and named tensors, dequantized to float32."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


@functools.lru_cache(maxsize=4)
def _reader(path: str, mtime_ns: int, size: int) -> GGUFReader:
    # Parsing the metadata of a 49k-token vocabulary takes seconds; the head, tokenizer, config and block
    # stacks of one process all read the same file, so they share one memory-mapped reader.
    del mtime_ns, size  # only part of the cache key: a rewritten file gets a fresh reader
    return GGUFReader(path)


def open_gguf(path: str | os.PathLike[str]) -> GGUFReader:
    """A (shared, cached) reader for the GGUF file at `path`; a clear error if it is missing or not GGUF."""
    resolved = Path(path).resolve()
    try:
        st = resolved.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"no GGUF file at {path}") from None
    try:
        return _reader(str(resolved), st.st_mtime_ns, st.st_size)
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from exc


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """The value of metadata field `key` as a Python object (str, int, float, list), or `default`."""
    entry = reader.fields.get(key)
    if entry is None:
        return default
    return entry.contents()


class GGUFWeights:
    """Named tensors of one GGUF file, dequantized on demand.

    GGUF stores a linear layer's weight as ``[out, in]`` rows (ggml's ne0 = in is the fast axis), which is what
    `tensor` returns. The block math computes ``x @ W`` on row vectors, so `linear` returns the transpose,
    ``[in, out]``, made contiguous once at load so every step's matmul reads memory in order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.reader = open_gguf(path)
        self._tensors = {t.name: t for t in self.reader.tensors}

    def __repr__(self) -> str:
        return f"<GGUFWeights {self.path} tensors={len(self._tensors)}>"

    def has(self, name: str) -> bool:
        """Whether the file holds a tensor called `name`."""
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as float32, in GGUF's row layout (``[out, in]`` for a weight matrix)."""
        info = self._tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path} has no tensor {name!r}")
        data = dequantize(info.data, info.tensor_type)
        # ggml lists dims fastest first; NumPy wants them slowest first.
        shape = tuple(int(d) for d in reversed(info.shape))
        out = np.ascontiguousarray(data.reshape(shape), dtype=np.float32)
        # Float32 tensors come back as views of the read-only memory map: own them, like dequantized ones.
        return out if out.flags.writeable else out.copy()

    def linear(self, name: str) -> np.ndarray:
        """Weight matrix `name` transposed to ``[in, out]`` and contiguous, ready for ``x @ W``."""
        w = self.tensor(name)
        if w.ndim != 2:
            raise ValueError(f"tensor {name} is not a matrix: shape {w.shape}")
        return np.ascontiguousarray(w.T)
