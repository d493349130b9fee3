"""KV-cache sizing of one instance in LLM-Mesh: the demand estimate of Eq. 2, watermark scaling and its cost.

An instance's KV cache is sized for what its requests will need, not for what they hold now: each request is
assumed to produce at least the average output length Ō seen so far, and the total never goes below L_min tokens
(the longest sequence served) so a lightly loaded instance can still take a long request (section 6.1). Resizing
copies blocks and takes time (Figure 8), so the cache grows early, straight to M_recommend = M_require * (1 + w),
and shrinks lazily, only once M_recommend * (1 + w) has fallen below the current size (section 6.2).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opentela.engines.headroom import RequestState

GB = 1e9


def kv_require_bytes(
    requests: Iterable[RequestState], mean_output: float, min_tokens: int, bytes_per_token: float
) -> float:
    """M_require of Eq. 2: C * max(sum of I_r + max(O_r, Ō), L_min)."""
    tokens = sum(r.input_tokens + max(r.output_tokens, mean_output) for r in requests)
    return bytes_per_token * max(tokens, float(min_tokens))


def kv_held_bytes(requests: Iterable[RequestState], bytes_per_token: float) -> float:
    """The KV cache the requests occupy now (prompt plus tokens produced)."""
    return bytes_per_token * sum(r.input_tokens + r.output_tokens for r in requests)


@dataclass(frozen=True)
class Watermark:
    """Early scale-up and lazy scale-down around M_recommend = M_require * (1 + w)."""

    w: float = 0.2
    """The watermark as a fraction (the paper's w %; it does not print the value it used)."""

    def recommend(self, require: float) -> float:
        """M_recommend for a requirement."""
        return require * (1.0 + self.w)

    def grow_to(self, current: float, require: float) -> float | None:
        """The size to scale up to when `current` falls short of `require`, else None."""
        return self.recommend(require) if current < require else None

    def shrink_to(self, current: float, require: float) -> float | None:
        """The size to scale down to once the recommendation is a watermark below `current`, else None."""
        target = self.recommend(require)
        return target if target * (1.0 + self.w) < current else None


@dataclass(frozen=True)
class ScalingCost:
    """Seconds to resize a KV cache, linear in the size scaled to.

    The paper measures one point each way on an A100 (Figure 8): 32 GB down to 16 GB in 0.3 s and up to 64 GB in
    1.9 s; resizing allocates the new blocks and copies the live ones, so the time is taken as proportional to the
    new size, at the rate of the matching measurement. The same rates are used on CPU nodes (no figure given).
    """

    up_s_per_gb: float = 1.9 / 64
    down_s_per_gb: float = 0.3 / 16

    def seconds(self, old_bytes: float, new_bytes: float) -> float:
        """Time to resize from `old_bytes` to `new_bytes`."""
        rate = self.up_s_per_gb if new_bytes > old_bytes else self.down_s_per_gb
        return rate * new_bytes / GB


@dataclass(frozen=True)
class ColdStart:
    """Time to load a model from the host-memory cache onto a device (all systems share the loader).

    GPU: weights over PCIe 4.0 x16 at 24 GB/s (about 75 % of its 32 GB/s, what a pinned-memory chunked loader such
    as ServerlessLLM's reaches) plus a fixed engine start; CPU: a copy out of the host cache at 20 GB/s plus the
    same start. Unloading frees the memory in `unload_s`.
    """

    gpu_gbs: float = 24.0
    cpu_gbs: float = 20.0
    fixed_s: float = 0.2
    unload_s: float = 0.05

    def seconds(self, weights_bytes: float, device: str) -> float:
        """Load time of `weights_bytes` on a "cpu" or "gpu" node."""
        rate = self.cpu_gbs if device == "cpu" else self.gpu_gbs
        return self.fixed_s + weights_bytes / (rate * GB)
