"""Connection limits: keep a node's peer connections between two watermarks and close the idle ones.

Two parts. `ConnectionLedger` is the bookkeeping and the policy, pure: no event loop, no sockets, time passed in
or read from an injectable clock, one pass over the connections per decision (plus a partial sort of the closable
ones when over the high watermark), so a simulator can run thousands of them.
`ConnectionManager` is the thin driver a Host owns: it feeds the ledger from the Host's real connections, trims on
a timer (and at once when a new connection crosses the high watermark) and closes what the ledger chose with
GOAWAY, so the peer sees an orderly goodbye and any stream already in flight still finishes.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from opentela._types import PeerId
from opentela.fabric._config import FabricConfig
from opentela.fabric._frames import ErrorCode
from opentela.fabric.mux import MuxConnection

logger = logging.getLogger(__name__)

BOOTSTRAP = "bootstrap"
"""Protection tag: a bootstrap peer this node joined through."""
RELAY = "relay"
"""Protection tag: a relay this node holds a slot on, or a private peer holding a slot on this relay."""
SERVING = "serving"
"""Protection tag: a replica the gateway routes requests to."""

Clock = Callable[[], float]

TRIM_INTERVAL = 5.0  # seconds between periodic trims; shorter when the idle timeout asks for it
_MIN_INTERVAL = 0.05
# A connection not sampled yet: its handshake counts as use at the first sample, as any stream opened between
# two samples does, so a newcomer is never ranked more idle than a peer that was merely busy a moment ago.
_UNSAMPLED = -1


class Trim(NamedTuple):
    """What one decision closes: connections idle past the timeout, then the most idle above the watermark."""

    idle: list[PeerId]
    excess: list[PeerId]


class _Entry:
    __slots__ = ("last_active", "opened_at", "streams")

    def __init__(self, now: float) -> None:
        self.opened_at = now
        self.last_active = now
        self.streams = 0


class ConnectionLedger:
    """Per-peer connection records and the rules choosing which connections to close.

    Above `high_water` open connections, unprotected ones are closed down to `low_water`, most idle first; one
    idle (no open stream) for longer than `idle_timeout` is closed whatever the count (0 turns that off). A
    connection with an open stream, one younger than `grace` and a protected one (any tag) are never chosen.
    Tags belong to the peer, not to a connection: set before it connects, they hold across reconnects.
    """

    def __init__(
        self,
        low_water: int,
        high_water: int,
        *,
        grace: float = 0.0,
        idle_timeout: float = 0.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if not 1 <= low_water <= high_water:
            raise ValueError(f"watermarks need 1 <= low <= high, got low={low_water} high={high_water}")
        if grace < 0 or idle_timeout < 0:
            raise ValueError("grace and idle_timeout cannot be negative")
        self.low_water = low_water
        self.high_water = high_water
        self.grace = grace
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._open: dict[PeerId, _Entry] = {}
        self._tags: dict[PeerId, set[str]] = {}  # only non-empty sets: membership means protected
        self.peak = 0
        self.trimmed = 0
        self.idle_closed = 0
        self.over_high = 0

    def __repr__(self) -> str:
        return (
            f"<ConnectionLedger open={len(self._open)} water={self.low_water}..{self.high_water} "
            f"protected={len(self._tags)} trimmed={self.trimmed} idle_closed={self.idle_closed}>"
        )

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._open

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    # --- connection events ----------------------------------------------------------------------------------
    def opened(self, peer_id: PeerId, now: float | None = None) -> None:
        """A connection to `peer_id` is up; one replacing a live connection (a duplicate) keeps its age."""
        now = self._now(now)
        entry = self._open.get(peer_id)
        if entry is None:
            self._open[peer_id] = _Entry(now)
            self.peak = max(self.peak, len(self._open))
        else:
            entry.last_active = now

    def closed(self, peer_id: PeerId) -> None:
        """The connection to `peer_id` is gone (its protection tags stay)."""
        self._open.pop(peer_id, None)

    def stream_opened(self, peer_id: PeerId, now: float | None = None) -> None:
        """A stream opened on the connection to `peer_id`."""
        entry = self._open.get(peer_id)
        if entry is not None:
            entry.streams += 1
            entry.last_active = self._now(now)

    def stream_closed(self, peer_id: PeerId, now: float | None = None) -> None:
        """A stream on the connection to `peer_id` finished."""
        entry = self._open.get(peer_id)
        if entry is not None:
            entry.streams = max(0, entry.streams - 1)
            entry.last_active = self._now(now)

    def observe(
        self, peer_id: PeerId, streams: int, *, active: bool = False, now: float | None = None
    ) -> None:
        """Set the open stream count of `peer_id` as sampled; any stream, a change or `active` counts as use."""
        entry = self._open.get(peer_id)
        if entry is None:
            return
        if streams or active or streams != entry.streams:
            entry.last_active = self._now(now)
        entry.streams = streams

    def streams(self, peer_id: PeerId) -> int:
        """Open streams on the connection to `peer_id` (0 when not connected)."""
        entry = self._open.get(peer_id)
        return entry.streams if entry is not None else 0

    # --- protection -----------------------------------------------------------------------------------------
    def protect(self, peer_id: PeerId, tag: str) -> None:
        """Never close the connection to `peer_id` while it holds `tag` (idempotent per tag)."""
        self._tags.setdefault(peer_id, set()).add(tag)

    def unprotect(self, peer_id: PeerId, tag: str) -> None:
        """Drop `tag` from `peer_id`; an absent tag is a no-op."""
        tags = self._tags.get(peer_id)
        if tags is not None:
            tags.discard(tag)
            if not tags:
                del self._tags[peer_id]

    def is_protected(self, peer_id: PeerId) -> bool:
        """Whether `peer_id` holds any protection tag."""
        return peer_id in self._tags

    def tags(self, peer_id: PeerId) -> frozenset[str]:
        """The protection tags `peer_id` holds."""
        return frozenset(self._tags.get(peer_id, ()))

    # --- the decision ---------------------------------------------------------------------------------------
    def trim(self, now: float | None = None) -> Trim:
        """Choose the connections to close now and forget them (the caller closes them).

        One pass over the connections, then a partial sort of the closable ones when over the high watermark.
        """
        now = self._now(now)
        idle_after = self.idle_timeout
        idle: list[PeerId] = []
        spare: list[tuple[float, float, PeerId]] = []
        for peer_id, entry in self._open.items():
            if entry.streams or now - entry.opened_at < self.grace or peer_id in self._tags:
                continue
            if idle_after and now - entry.last_active > idle_after:
                idle.append(peer_id)
            else:
                spare.append((entry.last_active, entry.opened_at, peer_id))
        left = len(self._open) - len(idle)
        excess: list[PeerId] = []
        if left > self.high_water:
            excess = [p for _, _, p in heapq.nsmallest(left - self.low_water, spare)]
        for peer_id in idle:
            del self._open[peer_id]
        for peer_id in excess:
            del self._open[peer_id]
        self.idle_closed += len(idle)
        self.trimmed += len(excess)
        if len(self._open) > self.high_water:
            self.over_high += 1  # everything left is busy, young or protected: nothing more may go
        return Trim(idle, excess)

    def stats(self) -> dict[str, int]:
        """Counters: open and protected connections, the watermarks, peak, and what was closed and why."""
        return {
            "open": len(self._open),
            "protected": sum(1 for peer_id in self._tags if peer_id in self._open),
            "low_water": self.low_water,
            "high_water": self.high_water,
            "peak": self.peak,
            "trimmed": self.trimmed,
            "idle_closed": self.idle_closed,
            "over_high": self.over_high,
        }


class ConnectionManager:
    """Keeps a Host's connections within its ledger's limits: samples them, trims on a timer, says GOAWAY.

    The Host reports each connection it adopts (`connected`) and drops (`disconnected`). Streams are not
    reported one by one: a trim samples each connection's open stream count and how many it ever opened,
    counters the multiplexer keeps anyway, so the request path pays nothing for this.
    """

    def __init__(
        self, config: FabricConfig, *, interval: float | None = None, clock: Clock | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._clock = clock or self._loop.time
        self.ledger = ConnectionLedger(
            config.conn_low_water,
            config.conn_high_water,
            grace=config.conn_grace,
            idle_timeout=config.conn_idle_timeout,
            clock=self._clock,
        )
        if interval is None:
            # Sampled activity is only as fine as the tick: tick often enough for the idle timeout to mean it.
            idle = config.conn_idle_timeout
            interval = max(_MIN_INTERVAL, min(TRIM_INTERVAL, idle / 4)) if idle else TRIM_INTERVAL
        self.interval = interval
        self._conns: dict[PeerId, MuxConnection] = {}
        self._seen: dict[PeerId, int] = {}  # streams each connection had opened at the last sample
        self._timer: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<ConnectionManager {self.ledger!r} every {self.interval:g}s>"

    # --- public surface -------------------------------------------------------------------------------------
    def protect(self, peer_id: PeerId, tag: str) -> None:
        """Never close the connection to `peer_id` while it holds `tag` (idempotent per tag; may precede it)."""
        self.ledger.protect(peer_id, tag)

    def unprotect(self, peer_id: PeerId, tag: str) -> None:
        """Drop `tag` from `peer_id`; an absent tag is a no-op."""
        self.ledger.unprotect(peer_id, tag)

    def is_protected(self, peer_id: PeerId) -> bool:
        """Whether `peer_id` holds any protection tag."""
        return self.ledger.is_protected(peer_id)

    def stats(self) -> dict[str, int]:
        """The ledger's counters (see ConnectionLedger.stats)."""
        return self.ledger.stats()

    # --- fed by the Host ------------------------------------------------------------------------------------
    def connected(self, peer_id: PeerId, conn: MuxConnection) -> None:
        """`conn` became the connection to `peer_id` (a new peer, or a duplicate replacing the old one)."""
        if self._closed:
            return
        self._conns[peer_id] = conn
        self._seen[peer_id] = _UNSAMPLED
        self.ledger.opened(peer_id)
        if len(self.ledger) > self.ledger.high_water and self._soon is None:
            # At once, but not inside the Host's registration: it finishes its bookkeeping first.
            self._soon = self._loop.call_soon(self._trim_soon)
        if self._timer is None:
            self._timer = self._loop.call_later(self.interval, self._tick)

    def disconnected(self, peer_id: PeerId) -> None:
        """The Host no longer has a connection to `peer_id`."""
        self._conns.pop(peer_id, None)
        self._seen.pop(peer_id, None)
        self.ledger.closed(peer_id)

    def close(self) -> None:
        """Stop trimming (the Host is shutting down and closes every connection itself)."""
        self._closed = True
        for handle in (self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._soon = None

    # --- trimming -------------------------------------------------------------------------------------------
    def trim(self) -> Trim:
        """Sample every connection, let the ledger choose, and send GOAWAY on the chosen ones."""
        now = self._clock()
        ledger, seen = self.ledger, self._seen
        for peer_id, conn in self._conns.items():
            opened = conn.streams_opened
            ledger.observe(peer_id, conn.stream_count, active=opened != seen[peer_id], now=now)
            seen[peer_id] = opened
        decision = ledger.trim(now)
        for reason, peers in (("idle", decision.idle), ("over the connection limit", decision.excess)):
            for peer_id in peers:
                conn = self._conns.pop(peer_id)
                del seen[peer_id]
                logger.debug("closing the connection to %s: %s", peer_id, reason, extra={"peer_id": peer_id})
                # GOAWAY, not close(): a stream the peer opened before hearing it still gets its answer.
                conn.go_away(ErrorCode.NO_ERROR, f"connection closed: {reason}")
        if decision.idle or decision.excess:
            logger.info(
                "trimmed connections",
                extra={"idle": len(decision.idle), "excess": len(decision.excess), "open": len(ledger)},
            )
        return decision

    def _trim_soon(self) -> None:
        self._soon = None
        self.trim()

    def _tick(self) -> None:
        self._timer = None
        self.trim()
        if self._conns and not self._closed:
            self._timer = self._loop.call_later(self.interval, self._tick)
