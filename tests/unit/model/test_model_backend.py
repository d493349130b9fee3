"""The backend's operations against plain, loop-by-loop reference implementations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from opentela.model.backend import Backend, NumpyBackend, get_backend
from opentela.model.blocks import BlockStack
from opentela.model.head import ClientHead

RNG = np.random.default_rng(7)


def ref_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for i, row in enumerate(x.astype(np.float64)):
        out[i] = row / math.sqrt(sum(v * v for v in row) / len(row) + eps) * w
    return out


def ref_rope(x: np.ndarray, positions: list[int], theta: float) -> np.ndarray:
    """Rotate each interleaved pair (2i, 2i+1) as a complex number by position * theta^(-2i/d)."""
    t, heads, dim = x.shape
    out = np.empty_like(x)
    for a in range(t):
        for h in range(heads):
            for i in range(dim // 2):
                z = complex(x[a, h, 2 * i], x[a, h, 2 * i + 1])
                z *= complex(
                    math.cos(positions[a] * theta ** (-2 * i / dim)),
                    math.sin(positions[a] * theta ** (-2 * i / dim)),
                )
                out[a, h, 2 * i], out[a, h, 2 * i + 1] = z.real, z.imag
    return out


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int) -> np.ndarray:
    """Per head, per query: softmax over the keys at or before its position."""
    t, heads, dim = q.shape
    n_kv = k.shape[0]
    out = np.zeros((t, heads, dim), dtype=np.float64)
    for h in range(heads):
        kv = h // (heads // n_kv)
        for a in range(t):
            visible = offset + a + 1
            scores = [float(q[a, h] @ k[kv, j]) / math.sqrt(dim) for j in range(visible)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            out[a, h] = sum(w / total * v[kv, j] for j, w in enumerate(weights))
    return out.reshape(t, heads * dim)


def tables(positions: list[int], dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    angles = np.array(positions)[:, None] * theta ** (-np.arange(dim // 2) * 2.0 / dim)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.fixture
def be() -> Backend:
    return get_backend("numpy")


def test_rms_norm(be: Backend) -> None:
    x = RNG.standard_normal((5, 48)).astype(np.float32) * 3
    w = RNG.standard_normal(48).astype(np.float32)
    got = be.to_numpy(be.rms_norm(be.asarray(x), be.asarray(w), 1e-5))
    np.testing.assert_allclose(got, ref_rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_rope_rotates_interleaved_pairs(be: Backend) -> None:
    positions = [0, 1, 7, 300]
    x = RNG.standard_normal((4, 3, 16)).astype(np.float32)
    cos, sin = tables(positions, 16, 10000.0)
    got = be.to_numpy(be.rope(be.asarray(x), be.asarray(cos), be.asarray(sin)))
    np.testing.assert_allclose(got, ref_rope(x, positions, 10000.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], x[0])  # position 0 is the identity
    # A rotation keeps each pair's length.
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


@pytest.mark.parametrize(("t", "offset"), [(1, 0), (1, 9), (6, 0), (4, 5)])
def test_causal_grouped_query_attention(be: Backend, t: int, offset: int) -> None:
    heads, n_kv, dim = 6, 2, 8
    s = offset + t
    q = RNG.standard_normal((t, heads, dim)).astype(np.float32)
    k = RNG.standard_normal((n_kv, s, dim)).astype(np.float32)
    v = RNG.standard_normal((n_kv, s, dim)).astype(np.float32)
    got = be.to_numpy(be.attention(be.asarray(q), be.asarray(k), be.asarray(v), offset))
    assert got.shape == (t, heads * dim)
    np.testing.assert_allclose(got, ref_attention(q, k, v, offset), rtol=1e-4, atol=1e-5)


def test_attention_ignores_future_keys(be: Backend) -> None:
    q = RNG.standard_normal((3, 2, 4)).astype(np.float32)
    k = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    v = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    first = be.to_numpy(be.attention(q, k, v, 0))[0]
    k2, v2 = k.copy(), v.copy()
    k2[:, 1:] += 100.0
    v2[:, 1:] -= 50.0
    np.testing.assert_array_equal(be.to_numpy(be.attention(q, k2, v2, 0))[0], first)


def test_silu_mul(be: Backend) -> None:
    gate = np.array([-1000.0, -2.0, 0.0, 3.0], dtype=np.float32)
    up = np.array([1.0, 2.0, 5.0, -1.0], dtype=np.float32)
    expected = [g / (1 + math.exp(-g)) * u if g > -700 else 0.0 for g, u in zip(gate, up, strict=True)]
    np.testing.assert_allclose(be.to_numpy(be.silu_mul(gate, up)), expected, rtol=1e-6)


def test_get_backend() -> None:
    assert isinstance(get_backend("numpy"), NumpyBackend)
    assert isinstance(get_backend("NumPy"), Backend)
    mine = NumpyBackend()
    assert get_backend(mine) is mine
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        get_backend("cuda")


def test_torch_backend_without_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def no_torch(name: str, *args: object) -> object:
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib, "import_module", no_torch)
    with pytest.raises(ImportError, match="pip install torch"):
        get_backend("torch")


def test_torch_backend_matches_numpy() -> None:
    pytest.importorskip("torch")
    tb, nb = get_backend("torch"), NumpyBackend()
    x = RNG.standard_normal((4, 6, 8)).astype(np.float32)
    k = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    v = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    cos, sin = tables([2, 3, 4, 5], 8, 10000.0)
    roped = tb.rope(tb.asarray(x), tb.asarray(cos), tb.asarray(sin))
    np.testing.assert_allclose(tb.to_numpy(roped), nb.rope(x, cos, sin), rtol=1e-5, atol=1e-6)
    got = tb.to_numpy(tb.attention(tb.asarray(x), tb.asarray(k), tb.asarray(v), 2))
    np.testing.assert_allclose(got, nb.attention(x, k, v, 2), rtol=1e-4, atol=1e-5)


def test_torch_blocks_match_numpy_blocks(model_path: Path, head: ClientHead) -> None:
    pytest.importorskip("torch")
    stacks = [BlockStack(model_path, 0, 4, backend=name) for name in ("numpy", "torch")]
    caches = [s.new_cache(8) for s in stacks]
    prompt = head.embed([1, 4093, 198, 19556, 216])
    prompt.flags.writeable = False  # as a block server's frames arrive
    for stack, cache in zip(stacks, caches, strict=True):
        stack.forward(prompt, cache)
    outs = [s.forward(head.embed([33]), c) for s, c in zip(stacks, caches, strict=True)]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=0.05)
