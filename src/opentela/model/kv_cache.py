"""Per-session attention caches and the byte budget they are kept within."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from opentela.errors import CapacityError, OpenTelaError

DTYPE_BYTES = 4  # caches are float32, like the activations that fill them


class CacheFull(CapacityError):
    """The cache budget cannot hold another session of that length, even after evicting idle ones."""

    code = "cache_full"


class UnknownSession(OpenTelaError, KeyError):
    """No open session has that id here (never opened, closed, or evicted after idling past its TTL)."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "unknown_session"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


@dataclass(frozen=True)
class CacheLayout:
    """The shape of one block's K (and V) per token: ``n_kv_heads x head_dim`` float32 values."""

    n_kv_heads: int
    head_dim: int

    def bytes_per_token(self, n_blocks: int) -> int:
        """Bytes of K and V one token takes across `n_blocks` blocks."""
        return 2 * self.n_kv_heads * self.head_dim * DTYPE_BYTES * n_blocks


class HasCacheLayout(Protocol):
    """Anything that can say how its caches are shaped (a `BlockStack`)."""

    @property
    def cache_layout(self) -> CacheLayout: ...

    @property
    def n_blocks(self) -> int: ...


class SessionCache:
    """One session's K and V for a run of consecutive blocks, preallocated for `max_length` tokens.

    Block i's keys are ``keys[i][:, :length]``, shaped ``[n_kv_heads, length, head_dim]``. The arrays are
    allocated uninitialised at full size, and the OS backs such large allocations with memory only as they are
    written (page by page, or by huge pages where enabled), so a session's memory grows towards its fixed
    reservation as tokens come.
    """

    def __init__(self, n_blocks: int, layout: CacheLayout, max_length: int) -> None:
        if n_blocks < 1 or max_length < 1:
            raise ValueError(f"a cache needs at least one block and one token, not {n_blocks} x {max_length}")
        self.n_blocks, self.layout, self.max_length = n_blocks, layout, max_length
        shape = (layout.n_kv_heads, max_length, layout.head_dim)
        self.keys: list[np.ndarray] = [np.empty(shape, np.float32) for _ in range(n_blocks)]
        self.values: list[np.ndarray] = [np.empty(shape, np.float32) for _ in range(n_blocks)]
        self.length = 0
        self.closed = False

    @classmethod
    def for_stack(cls, stack: HasCacheLayout, max_length: int, n_blocks: int | None = None) -> SessionCache:
        """A cache for all of `stack`'s blocks (or its first `n_blocks`)."""
        return cls(n_blocks or stack.n_blocks, stack.cache_layout, max_length)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.length}/{self.max_length} tokens"
        return f"<SessionCache {self.n_blocks} blocks, {state}>"

    @property
    def nbytes(self) -> int:
        """Bytes reserved for this cache (its full `max_length`)."""
        return self.layout.bytes_per_token(self.n_blocks) * self.max_length

    @property
    def used_bytes(self) -> int:
        """Bytes holding tokens so far."""
        return self.layout.bytes_per_token(self.n_blocks) * self.length

    @property
    def room(self) -> int:
        """Tokens that still fit."""
        return self.max_length - self.length

    def extend(self, block: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write new tokens' K, V ``[n_kv_heads, T, head_dim]`` of `block` after `length`; views of all so far.

        `length` moves only with `advance`, once every block has its entries, so a step that fails half-way
        leaves the cache as it was.
        """
        keys, values = self.keys, self.values  # one read: `release` may run in another thread meanwhile
        if self.closed or not keys:
            raise UnknownSession("this session's cache was closed or evicted")
        t = k.shape[1]
        end = self.length + t
        if end > self.max_length:
            raise ValueError(f"{t} more tokens overflow the cache: {self.length} of {self.max_length} used")
        keys[block][:, self.length : end] = k
        values[block][:, self.length : end] = v
        return keys[block][:, :end], values[block][:, :end]

    def advance(self, t: int) -> None:
        """Count `t` tokens written by `extend` into every block."""
        if not 0 <= self.length + t <= self.max_length:
            raise ValueError(f"cannot advance {t} tokens from {self.length} of {self.max_length}")
        self.length += t

    def truncate(self, n: int) -> None:
        """Forget every token from position `n` on (to re-run a step, or roll back a rejected draft)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a {self.length}-token cache to {n}")
        self.length = n

    def release(self) -> None:
        """Drop the arrays; later use raises UnknownSession."""
        self.closed = True
        self.keys, self.values = [], []


class CacheStore:
    """Session caches within a byte budget; a session reserves its whole `max_length` when it opens.

    When a new session does not fit, sessions idle for at least `idle_ttl_s` are evicted, least recently
    used first, and only as many as needed; if even evicting all of them would not make room, nothing is
    evicted and `CacheFull` is raised. Times come from `now` arguments or the `clock` callable, so tests
    need no sleeping. Safe to call from several threads.
    """

    def __init__(
        self,
        capacity_bytes: int,
        idle_ttl_s: float,
        layout: CacheLayout | None = None,
        *,
        n_blocks: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes < 0 or idle_ttl_s < 0:
            raise ValueError("capacity_bytes and idle_ttl_s must not be negative")
        self.capacity_bytes, self.idle_ttl_s = capacity_bytes, idle_ttl_s
        self.layout, self.n_blocks, self._clock = layout, n_blocks, clock
        self._caches: dict[str, SessionCache] = {}
        self._last_used: dict[str, float] = {}
        self._lock = threading.RLock()  # public methods call each other under it
        self._reserved = 0
        self.counters = {"opened": 0, "closed": 0, "evicted": 0, "refused": 0}

    @classmethod
    def for_stack(
        cls, stack: HasCacheLayout, capacity_bytes: int, idle_ttl_s: float, **kw: Any
    ) -> CacheStore:
        """A store whose sessions cover `stack`'s blocks by default."""
        return cls(capacity_bytes, idle_ttl_s, stack.cache_layout, n_blocks=stack.n_blocks, **kw)

    def __repr__(self) -> str:
        return f"<CacheStore {len(self._caches)} sessions, {self._reserved}/{self.capacity_bytes} bytes reserved>"

    @property
    def reserved_bytes(self) -> int:
        """Bytes reserved by open sessions (never more than `capacity_bytes`)."""
        return self._reserved

    @property
    def used_bytes(self) -> int:
        """Bytes holding tokens in open sessions."""
        with self._lock:
            return sum(c.used_bytes for c in self._caches.values())

    @property
    def sessions(self) -> tuple[str, ...]:
        """Open session ids, least recently used first."""
        with self._lock:
            return tuple(sorted(self._caches, key=self._last_used.__getitem__))

    def open(
        self,
        session_id: str,
        max_length: int,
        *,
        n_blocks: int | None = None,
        layout: CacheLayout | None = None,
        now: float | None = None,
    ) -> SessionCache:
        """Reserve and return a cache for `max_length` tokens; CacheFull if it cannot fit."""
        layout, n_blocks = layout or self.layout, n_blocks or self.n_blocks
        if layout is None or n_blocks is None:
            raise ValueError(
                "the store does not know the cache shape: pass layout and n_blocks to CacheStore or open() "
                "(CacheStore.for_stack(stack, capacity, ttl) sets both)"
            )
        need = layout.bytes_per_token(n_blocks) * max_length
        now = self._clock() if now is None else now
        with self._lock:
            if session_id in self._caches:
                raise ValueError(f"session {session_id!r} is already open")
            if not self._make_room(need, now):
                self.counters["refused"] += 1
                raise CacheFull(
                    f"a {max_length}-token cache needs {need} bytes; {self.capacity_bytes - self._reserved} of "
                    f"{self.capacity_bytes} are free and no idle session can give enough back"
                )
            cache = SessionCache(n_blocks, layout, max_length)
            self._caches[session_id] = cache
            self._last_used[session_id] = now
            self._reserved += need
            self.counters["opened"] += 1
            return cache

    def _make_room(self, need: int, now: float) -> bool:
        free = self.capacity_bytes - self._reserved
        if need <= free:
            return True
        idle = self.idle(now)
        if need > free + sum(self._caches[s].nbytes for s in idle):
            return False  # evicting would not help: keep everyone
        for session_id in idle:
            free += self._drop(session_id)
            self.counters["evicted"] += 1
            if need <= free:
                break
        return True

    def idle(self, now: float | None = None) -> list[str]:
        """Sessions idle for at least the TTL at `now`, least recently used first (the eviction order)."""
        now = self._clock() if now is None else now
        with self._lock:
            idle = [s for s in self._caches if now - self._last_used[s] >= self.idle_ttl_s]
            return sorted(idle, key=self._last_used.__getitem__)

    def _drop(self, session_id: str) -> int:
        cache = self._caches.pop(session_id)
        del self._last_used[session_id]
        self._reserved -= cache.nbytes
        cache.release()
        return cache.nbytes

    def get(self, session_id: str, now: float | None = None) -> SessionCache:
        """The session's cache, marked as used now; UnknownSession if it is not open."""
        with self._lock:
            cache = self._caches.get(session_id)
            if cache is None:
                raise UnknownSession(f"no open session {session_id!r}")
            self._mark(session_id, now)
            return cache

    def touch(self, session_id: str, now: float | None = None) -> None:
        """Mark the session as used now (a step ran); no-op if it is gone."""
        with self._lock:
            if session_id in self._caches:
                self._mark(session_id, now)

    def _mark(self, session_id: str, now: float | None) -> None:
        self._last_used[session_id] = self._clock() if now is None else now

    def close(self, session_id: str) -> bool:
        """Free the session's cache; False if it was not open (closing twice is harmless)."""
        with self._lock:
            if session_id not in self._caches:
                return False
            self._drop(session_id)
            self.counters["closed"] += 1
            return True

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Evict every session idle for at least the TTL; their ids, least recently used first."""
        now = self._clock() if now is None else now
        with self._lock:
            idle = self.idle(now)
            for session_id in idle:
                self._drop(session_id)
            self.counters["evicted"] += len(idle)
            return idle

    def stats(self) -> dict[str, int]:
        """Budget, reservations, use and counters, for status pages."""
        with self._lock:
            used = sum(c.used_bytes for c in self._caches.values())
            return {
                "capacity_bytes": self.capacity_bytes,
                "reserved_bytes": self._reserved,
                "free_bytes": self.capacity_bytes - self._reserved,
                "used_bytes": used,
                "sessions": len(self._caches),
                **self.counters,
            }
