"""How many threads the block math's BLAS may use, set once per process.

The thread count is part of what makes a step's result bit-exact: OpenBLAS splits a matrix product differently
for a different number of threads, so the same step run with 1 and with 2 threads can differ in the last bits
(measured on SmolLM2: up to 0.015 in a prompt's last hidden state). Every process that runs blocks therefore
pins the same count, whatever its machine's core count: then a session replayed on another server, or the
one-process reference, reproduces it exactly. One thread is also the right default where several block
servers share a machine: idle OpenBLAS threads spin, and with more threads than cores a step's wall time grew
2.6x in our three-server test (356 s against 135 s for 1,280 tokens on 2 cores).
"""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

DEFAULT_THREADS = 1


def set_blas_threads(threads: int | None = DEFAULT_THREADS) -> int | None:
    """Limit this process's BLAS to `threads` threads (None or 0: leave it); returns the count now in effect."""
    if threads:
        if threads < 0:
            raise ValueError(f"a thread count must be positive, not {threads}")
        # Not used as a context manager: the limit stays for the process, which is the point.
        threadpool_limits(limits=threads, user_api="blas")
    return blas_threads()


def blas_threads() -> int | None:
    """The thread count of this process's BLAS (the first one loaded), or None when NumPy uses none."""
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return int(pools[0]["num_threads"]) if pools else None
