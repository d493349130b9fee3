"""The array operations the block math needs, behind one small interface (NumPy built in, PyTorch optional)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

Array = Any
"""A backend's native array: `np.ndarray` for NumPy, `torch.Tensor` for PyTorch."""


@runtime_checkable
class Backend(Protocol):
    """The few operations a LLaMA block is made of.

    Arrays cross into the backend with `asarray` and back with `to_numpy`; everything else takes and returns
    native arrays. Shapes: `x` rows are tokens. `rope` rotates interleaved pairs ``(x[2i], x[2i+1])`` of each
    head, the layout GGUF files store Q and K in. `attention` takes roped queries ``[T, n_heads, head_dim]``
    and the whole cache ``[n_kv_heads, S, head_dim]`` (S = offset + T, the new tokens last), applies the causal
    mask (query t sees keys up to offset + t) and returns ``[T, n_heads * head_dim]``; query head h reads KV
    head ``h // (n_heads // n_kv_heads)``. Inputs and outputs are float32.
    """

    name: str

    def asarray(self, x: np.ndarray) -> Array:
        """A native array holding `x` (shares memory where the backend can)."""
        ...

    def to_numpy(self, x: Array) -> np.ndarray:
        """`x` as a float32 NumPy array."""
        ...

    def matmul(self, a: Array, b: Array) -> Array:
        """``a @ b``."""
        ...

    def concat(self, parts: Sequence[Array]) -> Array:
        """`parts` stacked along their first axis."""
        ...

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """Each row divided by its root mean square (plus `eps`), times `weight`."""
        ...

    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        """Rotate interleaved pairs of `x` ``[T, heads, head_dim]`` by angles with `cos`/`sin` ``[T, head_dim/2]``."""
        ...

    def attention(self, q: Array, k: Array, v: Array, offset: int) -> Array:
        """Causal grouped-query attention of `q` over the cache `k`, `v` (see the class docstring)."""
        ...

    def silu_mul(self, gate: Array, up: Array) -> Array:
        """``silu(gate) * up``, the gated MLP's activation."""
        ...


class NumpyBackend:
    """Float32 NumPy on the CPU; matmuls go to NumPy's BLAS, heads are batched, never looped over."""

    name = "numpy"

    def __repr__(self) -> str:
        return "<NumpyBackend>"

    def asarray(self, x: np.ndarray) -> np.ndarray:
        """`x` as float32 (no copy when it already is)."""
        return np.asarray(x, dtype=np.float32)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        """`x` itself."""
        return np.asarray(x, dtype=np.float32)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b``."""
        return np.matmul(a, b)

    def concat(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """`parts` stacked along their first axis."""
        return np.concatenate(parts, axis=0)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """Each row divided by its root mean square (plus `eps`), times `weight`."""
        mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x * (1.0 / np.sqrt(mean_square + np.float32(eps)))) * weight

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate interleaved pairs of `x` ``[T, heads, head_dim]`` by angles with `cos`/`sin` ``[T, head_dim/2]``."""
        t, heads, dim = x.shape
        pairs = x.reshape(t, heads, dim // 2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(pairs)
        out[..., 0] = even * c - odd * s
        out[..., 1] = even * s + odd * c
        return out.reshape(t, heads, dim)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int) -> np.ndarray:
        """Causal grouped-query attention of `q` over the cache `k`, `v` (see `Backend`)."""
        t, heads, dim = q.shape
        n_kv, s, _ = k.shape
        group = heads // n_kv
        # One matmul per KV head covers all of its query heads and tokens: [n_kv, group * T, dim].
        qg = q.reshape(t, n_kv, group, dim).transpose(1, 2, 0, 3).reshape(n_kv, group * t, dim)
        scores = np.matmul(qg, k.transpose(0, 2, 1)).reshape(n_kv, group, t, s)
        scores *= np.float32(1.0 / np.sqrt(dim))
        if t > 1:  # a single new token sees the whole cache; only a chunk needs the causal mask
            hidden = np.arange(s)[None, :] > (offset + np.arange(t))[:, None]
            scores[..., hidden] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.matmul(probs.reshape(n_kv, group * t, s), v)
        return out.reshape(n_kv, group, t, dim).transpose(2, 0, 1, 3).reshape(t, heads * dim)

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """``silu(gate) * up``; exp overflows to inf for very negative gates, which correctly gives 0."""
        with np.errstate(over="ignore"):
            return gate / (1.0 + np.exp(-gate)) * up


class TorchBackend:
    """Float32 PyTorch on the CPU; optional (``pip install torch``), imported only when asked for."""

    name = "torch"

    def __init__(self, threads: int | None = None) -> None:
        try:
            self.torch: Any = importlib.import_module("torch")
        except ImportError as exc:
            raise ImportError(
                "the torch backend needs PyTorch: pip install torch (or use backend='numpy')"
            ) from exc
        if threads is not None:
            self.torch.set_num_threads(threads)

    def __repr__(self) -> str:
        return f"<TorchBackend torch={self.torch.__version__}>"

    def asarray(self, x: np.ndarray) -> Any:
        """A CPU tensor sharing `x`'s memory (float32); read-only arrays are copied, as torch needs."""
        x = np.asarray(x, dtype=np.float32)
        return self.torch.from_numpy(x if x.flags.writeable else x.copy())

    def to_numpy(self, x: Any) -> np.ndarray:
        """`x` as a NumPy array."""
        return np.asarray(x.detach().cpu().numpy(), dtype=np.float32)

    def matmul(self, a: Any, b: Any) -> Any:
        """``a @ b``."""
        return self.torch.matmul(a, b)

    def concat(self, parts: Sequence[Any]) -> Any:
        """`parts` stacked along their first axis."""
        return self.torch.cat(list(parts), dim=0)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """Each row divided by its root mean square (plus `eps`), times `weight`."""
        return x * self.torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        """Rotate interleaved pairs of `x` ``[T, heads, head_dim]`` by angles with `cos`/`sin` ``[T, head_dim/2]``."""
        t, heads, dim = x.shape
        pairs = x.reshape(t, heads, dim // 2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        return self.torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).reshape(t, heads, dim)

    def attention(self, q: Any, k: Any, v: Any, offset: int) -> Any:
        """Causal grouped-query attention of `q` over the cache `k`, `v` (see `Backend`)."""
        torch = self.torch
        t, heads, dim = q.shape
        n_kv, s, _ = k.shape
        group = heads // n_kv
        qg = q.reshape(t, n_kv, group, dim).permute(1, 2, 0, 3).reshape(n_kv, group * t, dim)
        scores = torch.matmul(qg, k.transpose(1, 2)).reshape(n_kv, group, t, s) * (1.0 / dim**0.5)
        if t > 1:
            hidden = torch.arange(s)[None, :] > (offset + torch.arange(t))[:, None]
            scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs.reshape(n_kv, group * t, s), v)
        return out.reshape(n_kv, group, t, dim).permute(2, 0, 1, 3).reshape(t, heads * dim)

    def silu_mul(self, gate: Any, up: Any) -> Any:
        """``silu(gate) * up``."""
        return self.torch.nn.functional.silu(gate) * up


_BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": NumpyBackend, "torch": TorchBackend}


def get_backend(name: str | Backend = "numpy") -> Backend:
    """The backend called `name` ("numpy" or "torch"); an instance passes through unchanged."""
    if not isinstance(name, str):
        return name
    factory = _BACKENDS.get(name.lower())
    if factory is None:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(sorted(_BACKENDS))}")
    return factory()
