"""SessionCache bookkeeping and CacheStore's byte budget, eviction order and errors (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from opentela.errors import CapacityError, OpenTelaError
from opentela.model.kv_cache import CacheFull, CacheLayout, CacheStore, SessionCache, UnknownSession

LAYOUT = CacheLayout(n_kv_heads=2, head_dim=4)  # 2 * 2 * 4 * 4 = 64 bytes per token per block
PER_TOKEN = 64


def store(capacity_tokens: int, ttl: float = 10.0) -> CacheStore:
    return CacheStore(capacity_tokens * PER_TOKEN, ttl, LAYOUT, n_blocks=1)


def test_session_cache_extend_advance_truncate() -> None:
    cache = SessionCache(2, LAYOUT, 5)
    assert cache.nbytes == 2 * 5 * PER_TOKEN and cache.used_bytes == 0
    k = np.ones((2, 3, 4), np.float32)
    keys, values = cache.extend(0, k, 2 * k)
    assert keys.shape == (2, 3, 4) and np.array_equal(values, 2 * k)
    assert cache.length == 0  # not counted until every block is written
    cache.extend(1, k, k)
    cache.advance(3)
    assert (cache.length, cache.room, cache.used_bytes) == (3, 2, 3 * 2 * PER_TOKEN)
    keys, _ = cache.extend(0, 5 * np.ones((2, 2, 4), np.float32), k[:, :2])
    assert keys.shape == (2, 5, 4) and keys[0, 4, 0] == 5 and keys[0, 2, 0] == 1
    with pytest.raises(ValueError, match="overflow"):
        cache.extend(0, np.ones((2, 3, 4), np.float32), np.ones((2, 3, 4), np.float32))
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(2)
    with pytest.raises(ValueError):
        SessionCache(1, LAYOUT, 0)


def test_open_reserves_the_whole_length_up_front() -> None:
    s = store(100)
    cache = s.open("a", 30, now=0)
    assert cache.nbytes == 30 * PER_TOKEN
    assert s.reserved_bytes == 30 * PER_TOKEN and s.used_bytes == 0
    cache.extend(0, np.zeros((2, 4, 4), np.float32), np.zeros((2, 4, 4), np.float32))
    cache.advance(4)
    assert s.used_bytes == 4 * PER_TOKEN
    assert s.stats() == {
        "capacity_bytes": 100 * PER_TOKEN,
        "reserved_bytes": 30 * PER_TOKEN,
        "free_bytes": 70 * PER_TOKEN,
        "used_bytes": 4 * PER_TOKEN,
        "sessions": 1,
        "opened": 1,
        "closed": 0,
        "evicted": 0,
        "refused": 0,
    }
    assert s.open("b", 5, n_blocks=3, now=0).nbytes == 15 * PER_TOKEN  # a session over fewer or more blocks


def test_cache_full_when_nothing_is_idle() -> None:
    s = store(100, ttl=10)
    s.open("a", 60, now=0)
    s.open("b", 30, now=5)
    with pytest.raises(CacheFull, match="needs 1280 bytes"):
        s.open("c", 20, now=9)  # a is 9 s idle: under the TTL, so it stays
    assert s.sessions == ("a", "b") and s.stats()["refused"] == 1
    assert issubclass(CacheFull, CapacityError) and CacheFull("x").retryable


def test_only_idle_sessions_are_evicted_least_recently_used_first_and_only_as_needed() -> None:
    s = store(100, ttl=10)
    for name, at in (("a", 0), ("b", 1), ("c", 2), ("d", 15)):
        s.open(name, 25, now=at)
    s.touch("a", now=3)  # a is now more recent than b and c
    s.get("b", now=4)  # get marks use too: by last use, c (2), a (3), b (4), d (15)
    assert s.sessions == ("c", "a", "b", "d")
    cache_c = s.get("c", now=2)  # the same time again: no change
    s.open("e", 40, now=20)  # 0 free; c, a, b idle (d is 5 s idle): evict c (25) then a (25), not b
    assert s.sessions == ("b", "d", "e")
    assert cache_c.closed and s.stats()["evicted"] == 2
    assert s.reserved_bytes == 90 * PER_TOKEN
    with pytest.raises(UnknownSession):
        s.get("a")


def test_no_eviction_when_evicting_would_not_make_room() -> None:
    s = store(100, ttl=10)
    s.open("idle", 20, now=0)
    s.open("busy", 70, now=100)
    with pytest.raises(CacheFull):
        s.open("big", 40, now=100)  # idle gives back 20, 10 free: 30 < 40
    assert s.sessions == ("idle", "busy")


def test_evict_idle_close_and_unknown_sessions() -> None:
    clock = [0.0]
    s = CacheStore(100 * PER_TOKEN, 10, LAYOUT, n_blocks=1, clock=lambda: clock[0])
    s.open("a", 10)
    clock[0] = 5
    s.open("b", 10)
    clock[0] = 12
    assert s.evict_idle() == ["a"]
    assert s.sessions == ("b",)
    assert s.close("b") and not s.close("b")  # closing twice is harmless
    assert s.reserved_bytes == 0 and s.stats()["closed"] == 1
    with pytest.raises(UnknownSession, match="no open session 'b'") as info:
        s.get("b")
    assert isinstance(info.value, KeyError) and isinstance(info.value, OpenTelaError)
    s.touch("b")  # no-op for a gone session


def test_duplicate_sessions_and_missing_layout_are_refused() -> None:
    s = store(100)
    s.open("a", 10, now=0)
    with pytest.raises(ValueError, match="already open"):
        s.open("a", 10, now=0)
    bare = CacheStore(1000, 1)
    with pytest.raises(ValueError, match="does not know the cache shape"):
        bare.open("x", 1)
    assert bare.open("x", 2, n_blocks=1, layout=LAYOUT).nbytes == 2 * PER_TOKEN


class StoreMachine(RuleBasedStateMachine):
    """Random opens, closes, uses, evictions and clock moves: reservations stay within the budget."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.store = CacheStore(200 * PER_TOKEN, 5.0, LAYOUT, n_blocks=1, clock=lambda: self.now)
        self.names = 0
        self.caches: dict[str, SessionCache] = {}

    @rule(length=st.integers(1, 120), blocks=st.integers(1, 3))
    def open(self, length: int, blocks: int) -> None:
        name = f"s{self.names}"
        self.names += 1
        idle_before = set(self.store.idle(self.now))
        busy_before = set(self.store.sessions) - idle_before
        try:
            self.caches[name] = self.store.open(name, length, n_blocks=blocks)
        except CacheFull:
            assert set(self.store.sessions) == idle_before | busy_before  # a refusal evicts nobody
        assert busy_before <= set(self.store.sessions)  # sessions within their TTL are never evicted

    @precondition(lambda self: bool(self.store.sessions))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        assert self.store.close(data.draw(st.sampled_from(self.store.sessions)))

    @precondition(lambda self: bool(self.store.sessions))
    @rule(data=st.data())
    def use(self, data: st.DataObject) -> None:
        self.store.touch(data.draw(st.sampled_from(self.store.sessions)))

    @rule(dt=st.floats(0, 8))
    def wait(self, dt: float) -> None:
        self.now += dt

    @rule()
    def evict(self) -> None:
        for name in self.store.evict_idle():
            assert self.caches[name].closed

    @invariant()
    def within_budget(self) -> None:
        open_caches = [self.caches[s] for s in self.store.sessions]
        assert self.store.reserved_bytes == sum(c.nbytes for c in open_caches)
        assert 0 <= self.store.reserved_bytes <= self.store.capacity_bytes
        assert all(not c.closed for c in open_caches)


StoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_store_budget_holds = StoreMachine.TestCase
