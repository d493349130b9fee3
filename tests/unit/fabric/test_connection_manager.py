"""Connection limits: the pure ledger's rules (properties and examples) and the driver that applies them."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from fabric_helpers import HostFactory, read_all, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from opentela.errors import ConfigError
from opentela.fabric._config import FabricConfig
from opentela.fabric._frames import ErrorCode
from opentela.fabric.connection_manager import ConnectionLedger, ConnectionManager

PEERS = [f"peer-{i:02d}" for i in range(24)]
TAGS = ["bootstrap", "relay", "serving"]


# --- examples -------------------------------------------------------------------------------------------------
def ledger_with(n: int, low: int = 2, high: int = 4, **kw: Any) -> ConnectionLedger:
    """A ledger at time 0..n-1 with peers peer-00.. opened one second apart (peer-00 the most idle)."""
    ledger = ConnectionLedger(low, high, **kw)
    for i in range(n):
        ledger.opened(PEERS[i], now=float(i))
    return ledger


def test_over_high_water_the_most_idle_are_closed_down_to_low_water() -> None:
    ledger = ledger_with(5)
    ledger.stream_opened(PEERS[0], now=5.0)
    ledger.stream_closed(PEERS[0], now=6.0)  # used last: now the least idle
    decision = ledger.trim(now=10.0)
    assert decision.idle == [] and decision.excess == [PEERS[1], PEERS[2], PEERS[3]]
    stats = ledger.stats()
    assert (stats["open"], stats["trimmed"], stats["peak"], stats["over_high"]) == (2, 3, 5, 0)
    assert PEERS[0] in ledger and PEERS[4] in ledger


def test_at_or_under_high_water_nothing_is_trimmed() -> None:
    ledger = ledger_with(4)
    assert ledger.trim(now=100.0) == ([], []) and len(ledger) == 4


def test_busy_young_and_protected_connections_are_never_trimmed() -> None:
    ledger = ledger_with(6, low=1, high=2, grace=10.0)
    ledger.stream_opened(PEERS[0], now=20.0)
    ledger.protect(PEERS[1], "relay")
    ledger.opened(PEERS[6], now=15.0)  # 5 s old at the trim: within grace
    decision = ledger.trim(now=20.0)
    assert decision.excess == [PEERS[2], PEERS[3], PEERS[4], PEERS[5]]
    assert {p for p in PEERS if p in ledger} == {PEERS[0], PEERS[1], PEERS[6]}
    assert ledger.stats()["over_high"] == 1  # three left, all unclosable
    ledger.stream_closed(PEERS[0], now=21.0)
    assert ledger.trim(now=26.0).excess == [PEERS[6], PEERS[0]]  # out of grace and idle now, older first
    assert {p for p in PEERS if p in ledger} == {PEERS[1]} and ledger.stats()["over_high"] == 1


def test_idle_connections_close_below_the_watermarks_unless_protected_busy_or_disabled() -> None:
    ledger = ledger_with(3, low=8, high=10, idle_timeout=30.0)
    ledger.protect(PEERS[1], "bootstrap")
    ledger.stream_opened(PEERS[2], now=1.0)
    assert ledger.trim(now=30.0).idle == []  # peer-00 idle exactly 30 s: not longer
    assert ledger.trim(now=30.5).idle == [PEERS[0]]
    assert ledger.stats()["idle_closed"] == 1 and ledger.stats()["trimmed"] == 0
    never = ledger_with(3, low=8, high=10, idle_timeout=0.0)
    assert never.trim(now=1e9) == ([], [])


def test_idle_closing_waits_out_the_grace_period() -> None:
    ledger = ledger_with(1, idle_timeout=1.0, grace=10.0)
    assert ledger.trim(now=5.0).idle == []
    assert ledger.trim(now=10.0).idle == [PEERS[0]]


def test_protection_may_come_first_and_survives_reconnects_until_removed() -> None:
    ledger = ConnectionLedger(1, 1)
    ledger.protect(PEERS[0], "bootstrap")
    ledger.protect(PEERS[0], "bootstrap")  # idempotent
    ledger.protect(PEERS[0], "serving")
    ledger.unprotect(PEERS[0], "relay")  # never set: a no-op
    ledger.unprotect(PEERS[9], "relay")
    for t in (0.0, 1.0):
        ledger.opened(PEERS[0], now=t)
        ledger.opened(PEERS[1], now=t)
        ledger.opened(PEERS[2], now=t)
        assert ledger.trim(now=t).excess == [PEERS[1], PEERS[2]]
        ledger.closed(PEERS[0])
    assert ledger.tags(PEERS[0]) == {"bootstrap", "serving"}
    ledger.unprotect(PEERS[0], "bootstrap")
    assert ledger.is_protected(PEERS[0])
    ledger.unprotect(PEERS[0], "serving")
    assert not ledger.is_protected(PEERS[0]) and ledger.tags(PEERS[0]) == frozenset()


def test_a_replacing_connection_keeps_its_age_and_stats_count_protected_open_ones() -> None:
    ledger = ledger_with(2, grace=5.0)
    ledger.opened(PEERS[0], now=4.0)  # a duplicate won: same peer, no new connection counted
    assert len(ledger) == 2 and ledger.stats()["peak"] == 2
    ledger.protect(PEERS[0], "relay")
    ledger.protect(PEERS[7], "relay")  # not connected: not counted as open and protected
    assert ledger.stats() == {
        "open": 2,
        "protected": 1,
        "low_water": 2,
        "high_water": 4,
        "peak": 2,
        "trimmed": 0,
        "idle_closed": 0,
        "over_high": 0,
    }


def test_sampled_streams_count_as_activity() -> None:
    ledger = ledger_with(2, low=1, high=1)
    ledger.observe(PEERS[0], 0, active=True, now=8.0)  # streams came and went since the last sample
    ledger.observe(PEERS[1], 0, now=8.0)  # nothing happened
    assert ledger.trim(now=9.0).excess == [PEERS[1]]
    ledger.observe(PEERS[0], 2, now=10.0)
    assert ledger.streams(PEERS[0]) == 2 and ledger.streams(PEERS[5]) == 0
    ledger.observe(PEERS[5], 1, now=10.0)  # not connected: ignored
    assert PEERS[5] not in ledger


def test_the_clock_is_injectable() -> None:
    now = [0.0]
    ledger = ConnectionLedger(1, 1, idle_timeout=5.0, clock=lambda: now[0])
    ledger.opened(PEERS[0])
    now[0] = 5.5
    assert ledger.trim().idle == [PEERS[0]]


@pytest.mark.parametrize(("low", "high"), [(0, 4), (5, 4), (-1, -1)])
def test_bad_watermarks_are_refused(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="watermarks"):
        ConnectionLedger(low, high)
    with pytest.raises(ConfigError, match="conn_low_water"):
        FabricConfig(conn_low_water=low, conn_high_water=high)


def test_config_defaults_and_validation() -> None:
    config = FabricConfig()
    assert (config.conn_low_water, config.conn_high_water) == (32, 48)
    assert (config.conn_grace, config.conn_idle_timeout) == (20.0, 120.0)
    assert FabricConfig(conn_low_water=1, conn_high_water=1, conn_idle_timeout=0).conn_idle_timeout == 0
    for name in ("conn_grace", "conn_idle_timeout"):
        with pytest.raises(ConfigError, match=name):
            FabricConfig(**{name: -1.0})
    names = {f.name for f in dataclasses.fields(FabricConfig) if f.name.startswith("conn_")}
    assert names == {"conn_low_water", "conn_high_water", "conn_grace", "conn_idle_timeout"}


# --- properties -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Shadow:
    """What the test itself knows about one connection, kept apart from the ledger's own records."""

    opened_at: float
    last_active: float
    streams: int = 0


class LedgerMachine(RuleBasedStateMachine):
    """Random connection, stream, protection and clock events; every trim is checked against the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.conns: dict[str, Shadow] = {}
        self.tags: dict[str, set[str]] = {}

    @initialize(
        low=st.integers(1, 6),
        extra=st.integers(0, 6),
        grace=st.sampled_from([0.0, 3.0, 10.0]),
        idle=st.sampled_from([0.0, 4.0, 20.0]),
    )
    def setup(self, low: int, extra: int, grace: float, idle: float) -> None:
        self.ledger = ConnectionLedger(low, low + extra, grace=grace, idle_timeout=idle)

    def protected(self, peer: str) -> bool:
        return bool(self.tags.get(peer))

    @rule(peer=st.sampled_from(PEERS))
    def open(self, peer: str) -> None:
        self.ledger.opened(peer, now=self.now)
        shadow = self.conns.get(peer)
        if shadow is None:
            self.conns[peer] = Shadow(self.now, self.now)
        else:
            shadow.last_active = self.now

    @rule(peer=st.sampled_from(PEERS))
    def close(self, peer: str) -> None:
        self.ledger.closed(peer)
        self.conns.pop(peer, None)

    @rule(peer=st.sampled_from(PEERS))
    def stream_opened(self, peer: str) -> None:
        self.ledger.stream_opened(peer, now=self.now)
        if peer in self.conns:
            self.conns[peer].streams += 1
            self.conns[peer].last_active = self.now

    @precondition(lambda self: any(s.streams for s in self.conns.values()))
    @rule(data=st.data())
    def stream_closed(self, data: st.DataObject) -> None:
        peer = data.draw(st.sampled_from(sorted(p for p, s in self.conns.items() if s.streams)))
        self.ledger.stream_closed(peer, now=self.now)
        self.conns[peer].streams -= 1
        self.conns[peer].last_active = self.now

    @rule(peer=st.sampled_from(PEERS), tag=st.sampled_from(TAGS))
    def protect(self, peer: str, tag: str) -> None:
        self.ledger.protect(peer, tag)
        self.tags.setdefault(peer, set()).add(tag)

    @rule(peer=st.sampled_from(PEERS), tag=st.sampled_from(TAGS))
    def unprotect(self, peer: str, tag: str) -> None:
        self.ledger.unprotect(peer, tag)
        self.tags.get(peer, set()).discard(tag)

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, 7.0, 25.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def trim(self) -> None:
        ledger, now = self.ledger, self.now
        closable = {
            p
            for p, s in self.conns.items()
            if not s.streams and now - s.opened_at >= ledger.grace and not self.protected(p)
        }
        idle_due = {
            p
            for p in closable
            if ledger.idle_timeout and now - self.conns[p].last_active > ledger.idle_timeout
        }
        before = len(self.conns)
        stats_before = ledger.stats()
        decision = ledger.trim(now=now)
        chosen = set(decision.idle) | set(decision.excess)
        assert len(chosen) == len(decision.idle) + len(decision.excess)
        # Never a protected, busy or young connection; idle closes are exactly those idle too long.
        assert chosen <= closable
        assert set(decision.idle) == idle_due
        left = before - len(idle_due)
        if left <= ledger.high_water:
            assert decision.excess == []
        else:
            spare = closable - idle_due
            # Trimming stops at low water, and gets under high water whenever enough could be closed.
            assert len(decision.excess) == min(len(spare), left - ledger.low_water)
            kept = spare - set(decision.excess)
            if kept and decision.excess:
                assert max(self.conns[p].last_active for p in decision.excess) <= min(
                    self.conns[p].last_active for p in kept
                )
        for peer in chosen:
            del self.conns[peer]
        after = len(self.conns)
        assert after == len(ledger)
        assert after >= min(left, ledger.low_water)
        if len(closable - idle_due) >= left - ledger.high_water:
            assert after <= ledger.high_water
        stats = ledger.stats()
        assert stats["trimmed"] == stats_before["trimmed"] + len(decision.excess)
        assert stats["idle_closed"] == stats_before["idle_closed"] + len(decision.idle)
        assert stats["over_high"] == stats_before["over_high"] + (after > ledger.high_water)

    @invariant()
    def books_agree(self) -> None:
        if not hasattr(self, "ledger"):
            return
        assert {p for p in PEERS if p in self.ledger} == set(self.conns)
        assert all(self.ledger.streams(p) == s.streams for p, s in self.conns.items())
        assert all(self.ledger.is_protected(p) == self.protected(p) for p in PEERS)
        stats = self.ledger.stats()
        assert stats["open"] == len(self.conns) and stats["peak"] >= stats["open"]
        assert stats["protected"] == sum(1 for p in self.conns if self.protected(p))


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@settings(max_examples=200, deadline=None)
@given(
    low=st.integers(1, 10),
    extra=st.integers(0, 10),
    conns=st.lists(st.tuples(st.integers(0, 100), st.booleans(), st.booleans()), max_size=len(PEERS)),
)
def test_one_trim_reaches_the_watermark_whenever_enough_is_closable(
    low: int, extra: int, conns: list[tuple[int, bool, bool]]
) -> None:
    ledger = ConnectionLedger(low, low + extra, grace=10.0)
    closable = 0
    for peer, (opened, busy, protected) in zip(PEERS, conns, strict=False):
        ledger.opened(peer, now=float(opened))
        if busy:
            ledger.stream_opened(peer, now=float(opened))
        if protected:
            ledger.protect(peer, "serving")
        closable += not busy and not protected and opened <= 90
    count = len(ledger)
    ledger.trim(now=100.0)
    if count > ledger.high_water:
        assert len(ledger) == max(low, count - closable)  # down to low water, or as far as it could go
        assert (len(ledger) <= ledger.high_water) == (count - closable <= ledger.high_water)
    else:
        assert len(ledger) == count


# --- the driver -----------------------------------------------------------------------------------------------
class FakeConn:
    """The two counters the driver samples, and the GOAWAY it sends."""

    def __init__(self) -> None:
        self.stream_count = 0
        self.streams_opened = 0
        self.goaway: list[tuple[int, str]] = []

    def go_away(self, code: int, message: str) -> None:
        self.goaway.append((code, message))


async def test_the_driver_samples_stream_counters_and_says_goaway() -> None:
    now = [0.0]
    config = FabricConfig(conn_low_water=1, conn_high_water=2, conn_grace=0, conn_idle_timeout=10)
    manager = ConnectionManager(config, clock=lambda: now[0])
    assert manager.interval == 2.5  # a quarter of the idle timeout
    conns = {p: FakeConn() for p in PEERS[:4]}
    manager.connected(PEERS[0], conns[PEERS[0]])  # type: ignore[arg-type]
    manager.connected(PEERS[1], conns[PEERS[1]])  # type: ignore[arg-type]
    assert manager.trim() == ([], [])  # the first sample: both just shook hands
    now[0] = 5.0
    conns[PEERS[0]].streams_opened += 3  # three short streams between two samples
    now[0] = 12.0
    decision = manager.trim()
    assert decision.idle == [PEERS[1]] and conns[PEERS[1]].goaway == [
        (ErrorCode.NO_ERROR, "connection closed: idle")
    ]
    assert conns[PEERS[0]].goaway == []
    manager.disconnected(PEERS[1])  # the Host reports it gone once the peer answered: nothing changes
    # Crossing the high watermark trims at once (on the next loop pass), busy connections aside.
    conns[PEERS[2]].stream_count = 1
    manager.connected(PEERS[2], conns[PEERS[2]])  # type: ignore[arg-type]
    manager.connected(PEERS[3], conns[PEERS[3]])  # type: ignore[arg-type]
    assert all(not c.goaway for c in (conns[PEERS[0]], conns[PEERS[3]]))
    await asyncio.sleep(0)
    assert conns[PEERS[0]].goaway and conns[PEERS[3]].goaway and not conns[PEERS[2]].goaway
    assert manager.stats()["trimmed"] == 2 and manager.stats()["open"] == 1
    manager.protect(PEERS[3], "serving")
    assert manager.is_protected(PEERS[3])
    manager.unprotect(PEERS[3], "serving")
    assert not manager.is_protected(PEERS[3])
    manager.close()
    manager.connected(PEERS[0], conns[PEERS[0]])  # type: ignore[arg-type]
    assert len(manager.ledger) == 1  # closed: nothing is tracked any more


@given(st.sampled_from([0.0, 0.01, 1.0, 120.0, 1e6]))
def test_the_tick_follows_the_idle_timeout_within_bounds(idle: float) -> None:
    async def interval() -> float:
        return ConnectionManager(FabricConfig(conn_idle_timeout=idle)).interval

    tick = asyncio.run(interval())
    assert 0.05 <= tick <= 5.0 and (idle == 0 or tick <= max(0.05, idle / 4))


async def test_a_connection_counts_the_streams_it_ever_opened_both_ways(make_host: HostFactory) -> None:
    a, b = await make_host(), await make_host()
    for opener, other in ((a, b), (a, b), (b, a), (a, b), (b, a)):
        stream = await opener.open_stream(other.peer_id, "/echo", addrs=other.listen_addrs)
        await stream.write(b"x")
        await stream.write_eof()
        assert await read_all(stream) == b"x"
    dialer, listener = a.connection(b.peer_id), b.connection(a.peer_id)
    assert dialer is not None and listener is not None and dialer.initiator and not listener.initiator
    await wait_until(lambda: listener.streams_opened == 5)
    assert dialer.streams_opened == 5 and dialer.stream_count == listener.stream_count == 0
