"""Reading a GGUF file: metadata fields and named tensors, dequantized to float32."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
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


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's place in a GGUF file: byte offset and length, ggml type, and dims fastest first."""

    offset: int
    n_bytes: int
    tensor_type: int
    shape: tuple[int, ...]

    def view(self, name: str, data: np.ndarray) -> _MappedTensor:
        """The tensor's bytes in the memory-mapped file, shaped as the reader shapes them."""
        qtype = GGMLQuantizationType(self.tensor_type)
        raw = data[self.offset : self.offset + self.n_bytes]
        dims = tuple(reversed(self.shape))
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        array: np.ndarray
        if qtype == GGMLQuantizationType.F32:
            array = raw.view(np.float32).reshape(dims)
        elif qtype == GGMLQuantizationType.F16:
            array = raw.view(np.float16).reshape(dims)
        else:  # block-quantized: each row is its blocks' bytes
            array = raw.reshape(*dims[:-1], dims[-1] // block * block_bytes)
        return _MappedTensor(name, qtype, np.array(self.shape), array)


@dataclass(frozen=True)
class _MappedTensor:
    """The attributes of a reader tensor that `GGUFWeights` uses."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray
    data: np.ndarray


TensorIndex = dict[str, TensorEntry]


class GGUFWeights:
    """Named tensors of one GGUF file, dequantized on demand.

    GGUF stores a linear layer's weight as ``[out, in]`` rows (ggml's ne0 = in is the fast axis), which is what
    `tensor` returns. The block math computes ``x @ W`` on row vectors, so `linear` returns the transpose,
    ``[in, out]``, made contiguous once at load so every step's matmul reads memory in order.
    """

    def __init__(self, path: str | os.PathLike[str], index: TensorIndex | None = None) -> None:
        self.path = str(path)
        if index is None:
            self._tensors: dict[str, Any] = {t.name: t for t in open_gguf(path).tensors}
        else:
            # Another process parsed the file already: map the tensors at the offsets it found, skipping the
            # seconds a full parse of the metadata takes.
            data = np.memmap(self.path, dtype=np.uint8, mode="r")
            self._tensors = {name: entry.view(name, data) for name, entry in index.items()}

    def tensor_index(self) -> TensorIndex:
        """Where each tensor lies in the file: enough for another process to open it without parsing."""
        return {
            name: TensorEntry(
                int(t.data_offset), int(t.n_bytes), int(t.tensor_type), tuple(int(d) for d in t.shape)
            )
            for name, t in self._tensors.items()
        }

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

    def linear_part(
        self, name: str, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
    ) -> np.ndarray:
        """Part of weight matrix `name`, ``[in, out]`` like `linear`: GGUF rows (outputs) `rows` and columns
        (inputs) `cols`, half-open ranges. Only those rows and quantization blocks are dequantized, so a tensor-
        parallel rank loads just its slice; a column range must start and end on a quantization block."""
        info = self._tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path} has no tensor {name!r}")
        shape = tuple(int(d) for d in reversed(info.shape))
        if len(shape) != 2:
            raise ValueError(f"tensor {name} is not a matrix: shape {shape}")
        r0, r1 = rows if rows is not None else (0, shape[0])
        c0, c1 = cols if cols is not None else (0, shape[1])
        if not (0 <= r0 < r1 <= shape[0] and 0 <= c0 < c1 <= shape[1]):
            raise ValueError(f"rows {r0}:{r1}, columns {c0}:{c1} are outside {name}'s {shape}")
        block, block_bytes = GGML_QUANT_SIZES[info.tensor_type]
        if c0 % block or c1 % block:
            raise ValueError(f"columns {c0}:{c1} of {name} cut through its {block}-value quantization blocks")
        data = info.data[r0:r1]
        if data.dtype == np.uint8:  # quantized: each row is its blocks' bytes
            data = data[:, c0 // block * block_bytes : c1 // block * block_bytes]
        else:
            data = data[:, c0:c1]
        values = dequantize(np.ascontiguousarray(data), info.tensor_type).reshape(r1 - r0, c1 - c0)
        return np.ascontiguousarray(values.T, dtype=np.float32)
