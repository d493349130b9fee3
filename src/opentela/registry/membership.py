"""The SWIM driver over /otela/probe/1: probes, indirect probes, refutation, eviction; nothing here is in the CRDT.

Messages (msgpack maps, one request and one answer per stream; "u" is an optional list of piggybacked
membership updates [status, session, incarnation]):
  ping      {"p": target session, "u"}          -> {"a": incarnation, "u"}   or {"x": 1} (not that session)
  ping-req  {"r": target session, "w": peer id, "u"} -> {"a": incarnation}  or {"f": 1} (no answer either)
  evicted?  {"q": session}                      -> {"l": 1} when our replica holds that session LEFT, else {"l": 0}

Evictions signed by other members merge only with evidence (evictions.py): this node's own failed probe of the
session, a quorum of distinct signers, or, for our own session, a stall of our own loop or enough peers saying
(evicted?) that their replicas already hold it LEFT.

Routing exclusion is the union of SWIM suspicion (all probe paths failed, spread to everyone) and a local,
transport-level mark (our connection dropped or a request failed) that lasts until we hear from the peer again
and makes this node probe it at once.

With a partial view (`overlay`), a node probes only its active-view neighbours, the peers it marks unreachable
(a neighbour whose connection broke stays watched after the overlay replaced it), and the suspects it witnessed;
a suspicion it merely hears of makes it ping that session once, at a random moment within half the suspicion
timeout, so that it holds first-hand evidence by the time the neighbours' eviction arrives. Only neighbours'
connections count as transport-level signals: other connections are short-lived and closed on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from opentela._tasks import TaskSet
from opentela._types import PROTO_PROBE, Lifecycle, PeerId, SessionId, Stream
from opentela.errors import OpenTelaError
from opentela.fabric.host import Host
from opentela.fabric.messages import read_msg, write_msg
from opentela.registry._config import RegistryConfig
from opentela.registry.evictions import EvictionEvidence, Outcome
from opentela.registry.local_health import LocalHealth, LoopLag
from opentela.registry.overlay import Overlay
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry
from opentela.registry.rtt import RttTable
from opentela.registry.swim import Member, Status, SwimState, Update

logger = logging.getLogger(__name__)

MAX_PROBE_MESSAGE = 4096
EVICTION_QUERY_FANOUT = 8  # peers asked whether they hold our session LEFT
MAX_CHECKS = 16
"""Heard-of suspects pinged once at the same time: a member spreading suspicions of everyone (SWIM news is unsigned)
must not make every node ping the whole mesh; past it, a held eviction still makes this node probe (evidence)."""
NOT_THAT_SESSION = -1


class Membership:
    """Watches the other nodes' sessions with SWIM and evicts the ones that stay silent."""

    def __init__(
        self,
        host: Host,
        registry: Registry,
        *,
        config: RegistryConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        overlay: Overlay | None = None,
    ) -> None:
        self.host = host
        self.registry = registry
        self.overlay = overlay
        """The partial view whose neighbours this node probes; None: every live session is probed."""
        self.config = config or RegistryConfig()
        self.clock = clock
        self._rng = rng or random.Random()
        self.swim = SwimState(
            registry.session_id,
            suspicion_timeout=self.config.suspicion_timeout,
            retransmit_mult=self.config.retransmit_mult,
            rng=self._rng,
        )
        self.health = LocalHealth(self.config.local_health_limit)
        self.loop_lag = LoopLag(interval=min(0.25, self.config.probe_timeout / 2))
        self._refutations_seen = 0
        self.unreachable: dict[PeerId, str] = {}
        self.last_seen: dict[PeerId, float] = {}
        self.rtt = RttTable()
        self._probing: set[SessionId] = set()
        self._releasing: set[SessionId] = set()
        self._asking: set[SessionId] = set()
        self._silent: dict[SessionId, float] = {}  # sessions whose latest probe by us failed, and when
        self._checked: dict[SessionId, int] = {}  # heard-of suspects we pinged once, at that incarnation
        self._checking: set[SessionId] = set()  # those whose ping is still to come
        self._confirmed: dict[SessionId, set[PeerId]] = {}  # peers whose replicas hold our session LEFT
        self.evidence = EvictionEvidence(
            quorum=self.config.eviction_quorum,
            hold=self.config.eviction_hold,
            signer_limit=self.config.eviction_signer_limit,
            signer_window=self.config.eviction_signer_window,
            clock=clock,
        )
        self._tasks = TaskSet("swim")
        self._closed = False
        self.counters: dict[str, int] = {
            "probes_sent": 0,
            "probes_failed": 0,
            "probes_inconclusive": 0,
            "indirect_probes_sent": 0,
            "suspicions": 0,
            "refutations": 0,
            "evictions": 0,
            "evictions_held": 0,
            "evictions_unconfirmed": 0,
            "evictions_confirmed": 0,
            "evictions_quorum": 0,
            "evictions_refused": 0,
            "evictions_rate_limited": 0,
        }

    def __repr__(self) -> str:
        return f"<Membership {self.swim!r} unreachable={len(self.unreachable)}>"

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve probes, watch connections, start the protocol period."""
        self.host.set_handler(PROTO_PROBE, self.rpc_probe)
        if self.overlay is None:
            self.host.on_peer_disconnected(lambda peer: self.suspect(peer, "connection lost"))
        else:
            self.overlay.on_neighbour_failed(lambda peer: self.suspect(peer, "connection lost"))
            self.overlay.set_usable(lambda peer: not self.is_suspected(peer))
        self.host.on_peer_connected(self.confirm_alive)
        self.swim.on_change(self._on_member_change)
        self.registry.eviction_check = self.check_eviction
        self._spawn(self._probe_loop(), "swim-probe-loop")
        # Sampled even without local health: a stall of our own loop is evidence for an eviction of us.
        self._spawn(self.loop_lag.run(), "swim-loop-lag")

    async def aclose(self) -> None:
        """Stop probing."""
        self._closed = True
        await self._tasks.aclose()

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.spawn(coro, name)

    def restart(self, session: SessionId) -> None:
        """Our node carries on under a new session."""
        self.swim.restart(session)

    def _on_member_change(self, member: Member) -> None:
        if member.status is Status.SUSPECT:
            self.counters["suspicions"] += 1
            logger.info(
                "session suspected",
                extra={"peer_id": member.peer, "session": member.session[:12], "witnessed": member.witnessed},
            )
        else:
            logger.info(
                "session alive again",
                extra={
                    "peer_id": member.peer,
                    "session": member.session[:12],
                    "incarnation": member.incarnation,
                },
            )

    # --- verdicts -----------------------------------------------------------------------------------------
    def is_suspected(self, peer: PeerId) -> bool:
        """Whether routing should avoid `peer`: a transport failure not yet cleared, or only suspected sessions.

        A peer that restarted under the same key has its old session suspected and its new one alive: it is not.
        """
        if peer in self.unreachable:
            return True
        statuses = {m.status for m in self.swim.members.values() if m.peer == peer}
        return statuses == {Status.SUSPECT}

    def is_excluded(self, record: NodeRecord) -> bool:
        """Whether routing should avoid this session."""
        return record.peer_id in self.unreachable or self.swim.is_suspected(record.session_id)

    def suspect(self, peer: PeerId, reason: str) -> None:
        """A transport-level failure: avoid `peer` until we hear from it, and probe its sessions now."""
        if peer == self.host.peer_id:
            return
        if peer not in self.unreachable:
            logger.info("peer unreachable", extra={"peer_id": peer, "reason": reason})
        self.unreachable[peer] = reason
        for member in [m for m in self.swim.members.values() if m.peer == peer]:
            if member.session not in self._probing:
                self._spawn(self.probe(member), "swim-urgent-probe")

    def confirm_alive(self, peer: PeerId) -> None:
        """We heard from `peer` (a connection, an inbound stream, an answer)."""
        self.last_seen[peer] = self.clock()
        if self.unreachable.pop(peer, None) is not None:
            logger.info("peer reachable again", extra={"peer_id": peer})

    # --- the protocol period ------------------------------------------------------------------------------
    def _live_sessions(self) -> dict[SessionId, PeerId]:
        return {r.session_id: r.peer_id for r in self.registry.records() if r.lifecycle <= Lifecycle.SERVING}

    def tick(self) -> list[NodeRecord]:
        """Bookkeeping of one period: follow the registry, evict sessions past their grace; returns evictions."""
        if self.swim.refutations > self._refutations_seen:
            # Others found us silent for a whole probe round: we are probably the slow one.
            self._refutations_seen = self.swim.refutations
            self.health.degrade()
        self.swim.suspicion_timeout = self.config.suspicion_timeout * self.health.multiplier
        self.swim.sync(self._live_sessions())
        known = {m.peer for m in self.swim.members.values()}
        for peer in [p for p in self.unreachable if p not in known]:
            del self.unreachable[peer]
        for session in [s for s in self._silent if s not in self.swim.members]:
            del self._silent[session]
        for session in [s for s in self._checked if not self.swim.is_suspected(s)]:
            del self._checked[session]
        self._recheck_evictions()
        held = set(self.evidence.sessions())
        for session in [s for s in self._confirmed if s not in held]:
            del self._confirmed[session]
        return self.evict_due()

    def evict_due(self) -> list[NodeRecord]:
        """Evict the sessions we saw failing whose grace is over; returns the evictions written."""
        written = []
        now = self.clock()
        for member in self.swim.due_evictions(now):
            if not member.witnessed and not self._failed_here(member.session, now):
                # Heard of, never seen failing by us: the witnesses (its neighbours) write the eviction.
                continue
            if not self._in_touch(member.peer, now):
                # We hear from nobody else either: we may be the one cut off, and evicting the whole mesh from
                # here would force every node to rejoin once we are back. Routing avoids the session meanwhile.
                self.counters["evictions_held"] += 1
                continue
            reason = f"no answer to any probe for {self.swim.suspicion_timeout:g} s (SWIM)"
            record = self.registry.evict(member.session, reason)
            self.swim.remove(member.session)
            if record is not None:
                self.counters["evictions"] += 1
                written.append(record)
        return written

    def _in_touch(self, suspect: PeerId, now: float) -> bool:
        """Whether some other node answered us within the grace period (or there is no other node to ask)."""
        others = {m.peer for m in self.swim.members.values()} - {suspect}
        horizon = now - self.config.suspicion_timeout
        return not others or any(self.last_seen.get(p, -1e300) >= horizon for p in others)

    def watched(self) -> set[SessionId] | None:
        """The sessions this node probes: its neighbours' and those of peers marked unreachable (None: all).

        A neighbour whose connection broke leaves the active view at once (the overlay repairs around it), but
        the break is first-hand evidence only this node holds, and the urgent probe in `suspect` may give no
        verdict: SWIM may not track the peer's sessions yet (its record just arrived; `tick` adds it), a probe
        already in flight may have got the last answer, or our loop stalled. So the peer stays watched while
        it is unreachable: until we hear from it again (alive) or its sessions leave the membership (evicted
        or left); once suspected, it is pinged every period as any witnessed suspect, held eviction or not.
        """
        if self.overlay is None:
            return None
        return self._sessions_of({*self.overlay.active(), *self.unreachable})

    def _sessions_of(self, peers: set[PeerId]) -> set[SessionId]:
        return {s for s, m in self.swim.members.items() if m.peer in peers}

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval * (0.9 + 0.2 * self._rng.random()))
            self.tick()
            watched = self.watched()
            target = self.swim.next_target(watched)
            # Suspected sessions we watch get a direct ping every period as well, so one that was only slow
            # refutes promptly once it runs again. Probes run as tasks: a failing one (probe_timeout +
            # indirect_timeout) does not stretch the period.
            for member in self.swim.suspected():
                if member is target or member.session in self._probing:
                    continue
                if watched is None or member.session in watched or member.witnessed:
                    self._spawn(self._ping_only(member), "swim-ping")
                elif (
                    self._checked.get(member.session) != member.incarnation
                    and len(self._checking) < MAX_CHECKS
                ):
                    self._checked[member.session] = member.incarnation
                    self._checking.add(member.session)
                    self._spawn(self._check_once(member), "swim-check")
            if target is not None and target.session not in self._probing:
                self._spawn(self.probe(target), "swim-probe")

    async def _check_once(self, member: Member) -> None:
        """Ping a suspect we only heard of, once, at a random moment within half the suspicion timeout.

        Its neighbours evict it a suspicion timeout after they suspected it; by then this node holds evidence of
        its own (a failed ping) and merges their eviction at once, and the spread delay keeps a large mesh from
        pinging a suspect all at the same moment.
        """
        try:
            await asyncio.sleep(self._rng.uniform(0, self.swim.suspicion_timeout / 2))
            if self.swim.is_suspected(member.session) and member.session not in self._probing:
                await self._ping_only(member)
        finally:
            self._checking.discard(member.session)

    async def _ping_only(self, member: Member) -> None:
        self._probing.add(member.session)
        started = self.loop_lag.clock()
        try:
            answer = await self.call_ping(member)
        finally:
            self._probing.discard(member.session)
        if answer is not None and answer >= 0:
            self._silent.pop(member.session, None)
            self.swim.acked(member.session, answer, self.clock())
        elif not self._stalled_since(started):
            self._record_silence(member)

    async def _evict_when_due(self, member: Member) -> None:
        # The eviction is written when the grace ends, not at the next protocol period after it (up to
        # probe_interval later): the LEFT record is what tells nodes that never probed the session.
        if member.suspected_at is None:
            return
        await asyncio.sleep(max(0.0, member.suspected_at + self.swim.suspicion_timeout - self.clock()))
        if not self._closed and self.swim.is_suspected(member.session):
            self.evict_due()

    def _record_silence(self, member: Member) -> None:
        self._silent[member.session] = self.clock()

    async def probe(self, member: Member) -> bool:
        """Probe one session: directly, then through helpers; suspect it when every path fails."""
        self._probing.add(member.session)
        started = self.loop_lag.clock()
        try:
            answer = await self.call_ping(member, self.config.probe_timeout * self.health.multiplier)
            if answer is None:
                answer = await self._probe_indirectly(member)
            now = self.clock()
            if answer is None and self._stalled_since(started):
                # Our own loop stalled while we waited: the silence may be ours. No verdict on the peer.
                self.counters["probes_inconclusive"] += 1
                self.health.degrade()
                return False
            if answer is None or answer == NOT_THAT_SESSION:
                self.counters["probes_failed"] += 1
                self._record_silence(member)
                first_hand = not member.witnessed or member.status is not Status.SUSPECT
                self.swim.probe_failed(member.session, now)
                if first_hand:
                    self._spawn(self._evict_when_due(member), "swim-eviction-due")
                return False
            self._silent.pop(member.session, None)
            self.swim.acked(member.session, answer, now)
            self.health.improve()
            return True
        finally:
            self._probing.discard(member.session)

    def _stalled_since(self, started: float) -> bool:
        """Whether this process's event loop stalled for half a probe timeout or more since `started`."""
        if not self.config.local_health_limit:
            return False
        return self.loop_lag.worst_since(started) >= self.config.probe_timeout / 2

    async def _probe_indirectly(self, target: Member) -> int | None:
        # Helpers are neighbours only (open connections), never a peer we just lost.
        neighbours = None if self.overlay is None else self._sessions_of(set(self.overlay.active()))
        helpers = self.swim.helpers(target, self.config.indirect_probes, neighbours)
        if not helpers:
            return None
        self.counters["indirect_probes_sent"] += len(helpers)
        pending = {asyncio.ensure_future(self.call_ping_req(h, target)) for h in helpers}
        try:
            async with asyncio.timeout(self.config.indirect_timeout * self.health.multiplier):
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        if (answer := task.result()) is not None:
                            return answer
        except TimeoutError:
            pass
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return None

    # --- evictions signed by others ----------------------------------------------------------------------
    def check_eviction(self, record: NodeRecord) -> bool:
        """Whether another member's eviction may merge now (Registry.eviction_check); otherwise it is held.

        It may when the session is not live here (nothing to protect), when our own latest probe of it failed,
        or when a quorum of distinct members evicted it. An eviction of our own session needs evidence too: our
        event loop stalled for half the suspicion timeout, or enough peers sign it or say they hold it LEFT.
        """
        session = record.session_id
        if session in self._releasing:
            return True
        own = session == self.registry.session_id
        if not own and not self._is_live_here(record):
            self.evidence.take(session)
            return True
        if self._has_evidence(record, own):
            # This one merges; any other held eviction of the session is redundant (LEFT is terminal).
            self.counters["evictions_confirmed"] += 1
            self.evidence.take(session)
            return True
        outcome = self.evidence.hold(record)
        if outcome is Outcome.RATE_LIMITED:
            self.counters["evictions_rate_limited"] += 1
            logger.warning(
                "dropped an eviction: its signer sends too many without evidence",
                extra={"session": session[:12], "signer": record.signer},
            )
            return False
        if outcome in (Outcome.KNOWN, Outcome.FULL):
            return False
        if self.evidence.has_quorum(session):
            self.counters["evictions_quorum"] += 1
            self.evidence.take(session)
            return True
        if outcome is Outcome.HELD:
            self.counters["evictions_unconfirmed"] += 1
            logger.info(
                "holding an eviction of a session this node still reaches",
                extra={"session": session[:12], "signer": record.signer, "reason": record.reason},
            )
        if own and session not in self._asking:
            self._spawn(self._ask_about_us(session), "swim-eviction-query")
        elif not own and session not in self._probing:
            member = self.swim.members.get(session) or Member(session, record.peer_id)
            self._spawn(self._probe_held(member), "swim-eviction-probe")
        return False

    def _is_live_here(self, record: NodeRecord) -> bool:
        current = self.registry.get(record.session_id)
        if current is None:
            # Unknown here: protect it only when its node is connected to us (a fresh joiner's first session).
            return record.peer_id in self.host.connected_peers()
        return current.lifecycle <= Lifecycle.SERVING

    def _has_evidence(self, record: NodeRecord, own: bool) -> bool:
        """Our own reason to believe `record`'s session is gone (its held quorum aside)."""
        now = self.clock()
        if own:
            stall = self.loop_lag.worst_since(now - self.config.eviction_hold)
            if stall >= self.config.suspicion_timeout / 2:
                # We stalled too long to refute a suspicion: the others rightly gave up on us.
                logger.info("our event loop stalled %.1f s: taking the eviction of our session", stall)
                return True
            # The mesh merged it: enough peers (signers, or replicas that hold it LEFT) of those we know, so
            # that one member alone, signing and confirming, is never enough where there is anyone else. The
            # peers we are connected to count even before their records reach us: a joiner in its first sync
            # knows few records, and must not take one member's word because of that.
            signers = self.evidence.signers(record.session_id) | {record.signer}
            support = signers | self._confirmed.get(record.session_id, set())
            known = set(self._live_sessions().values()) | set(self.host.connected_peers())
            peers = known - {self.host.peer_id} | signers
            return len(support) >= min(self.config.eviction_quorum, len(peers))
        member = self.swim.members.get(record.session_id)
        if member is not None and member.status is Status.SUSPECT and member.witnessed:
            return True
        return self._failed_here(record.session_id, now)

    def _failed_here(self, session: SessionId, now: float) -> bool:
        """Whether our own latest probe or ping of `session` failed, within the eviction hold."""
        failed_at = self._silent.get(session)
        return failed_at is not None and now - failed_at <= self.config.eviction_hold

    async def _ask_about_us(self, session: SessionId) -> None:
        """Ask live peers whether their replicas hold our session LEFT; then re-check the held evictions."""
        self._asking.add(session)
        try:
            by_peer = {
                p: sid
                for sid, p in self._live_sessions().items()
                if p != self.host.peer_id and not self.swim.is_suspected(sid)
            }
            asked = self._rng.sample(sorted(by_peer), min(len(by_peer), EVICTION_QUERY_FANOUT))
            query = {"q": session}
            answers = await asyncio.gather(
                *(self._exchange(p, by_peer[p], query, self.config.indirect_timeout) for p in asked)
            )
            yes = {
                p
                for p, reply in zip(asked, answers, strict=True)
                if reply is not None and reply.get("l") == 1
            }
            if yes:
                self._confirmed.setdefault(session, set()).update(yes)
        finally:
            self._asking.discard(session)
        self._recheck_evictions()

    async def _probe_held(self, member: Member) -> None:
        """Probe a session that another member evicted; merge the held evictions if it fails here too."""
        if member.session in self.swim.members:
            await self.probe(member)
        else:
            await self._ping_only(member)
        self._recheck_evictions()

    def _recheck_evictions(self) -> None:
        """Merge held evictions that now have evidence, drop moot ones, refuse those held too long."""
        for record in self.evidence.expire():
            self.counters["evictions_refused"] += 1
            logger.info(
                "refused an eviction: this node still reaches the session",
                extra={"session": record.session_id[:12], "signer": record.signer},
            )
        for session in self.evidence.sessions():
            held = self.evidence.held(session)
            latest = max(held, key=lambda r: r.rank)
            own = session == self.registry.session_id
            if not own and not self._is_live_here(latest):
                self.evidence.take(session)
            elif self._has_evidence(latest, own):
                self.counters["evictions_confirmed"] += 1
                self._release(session)

    def _release(self, session: SessionId) -> None:
        """Merge the held evictions of `session`, past the check (we hold evidence for them now)."""
        held = self.evidence.take(session)
        self._releasing.add(session)
        try:
            self.registry.apply_remote(held)
        finally:
            self._releasing.discard(session)

    # --- calls --------------------------------------------------------------------------------------------
    def _addrs_of(self, session: SessionId) -> tuple[str, ...]:
        record = self.registry.get(session)
        return record.addrs if record is not None else ()

    def _updates_for(self, recipient: SessionId | None) -> list[Any]:
        return [u.to_wire() for u in self.swim.piggyback(recipient, self.config.max_piggyback)]

    async def _exchange(
        self, peer: PeerId, session: SessionId, message: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(timeout):
                stream = await self.host.open_stream(
                    peer, PROTO_PROBE, addrs=self._addrs_of(session), timeout=timeout
                )
                try:
                    await write_msg(stream, message)
                    reply = await read_msg(stream, MAX_PROBE_MESSAGE)
                finally:
                    await stream.aclose()
        except (OpenTelaError, TimeoutError, asyncio.IncompleteReadError, OSError):
            return None
        if not isinstance(reply, dict):
            return None
        self.confirm_alive(peer)
        self._take_updates(reply.get("u"))
        return reply

    async def call_ping(self, member: Member, timeout: float | None = None) -> int | None:
        """Ping a session directly: its incarnation, NOT_THAT_SESSION, or None when it did not answer."""
        self.counters["probes_sent"] += 1
        message: dict[str, Any] = {"p": member.session}
        if updates := self._updates_for(member.session):
            message["u"] = updates
        began = time.perf_counter()
        reply = await self._exchange(
            member.peer, member.session, message, timeout or self.config.probe_timeout
        )
        if reply is not None:
            self.rtt.observe(member.peer, time.perf_counter() - began)
        return _answer(reply)

    async def call_ping_req(self, helper: Member, target: Member) -> int | None:
        """Ask `helper` to ping `target` for us: the target's incarnation, or None."""
        message: dict[str, Any] = {"r": target.session, "w": target.peer}
        if updates := self._updates_for(helper.session):
            message["u"] = updates
        reply = await self._exchange(
            helper.peer, helper.session, message, self.config.indirect_timeout * self.health.multiplier
        )
        answer = _answer(reply)
        return None if answer == NOT_THAT_SESSION else answer

    def _take_updates(self, raw: Any) -> None:
        if not isinstance(raw, list):
            return
        now = self.clock()
        before = self.swim.incarnation
        for item in raw[: self.config.max_piggyback * 2]:
            try:
                update = Update.from_wire(item)
            except ValueError as exc:
                logger.debug("dropped a malformed membership update: %s", exc)
                continue
            self.swim.apply(update, now)
        if self.swim.incarnation != before:
            self.counters["refutations"] += 1
            logger.info("refuted a suspicion of this node", extra={"incarnation": self.swim.incarnation})

    # --- serving ------------------------------------------------------------------------------------------
    def _session_of(self, peer: PeerId) -> SessionId | None:
        # A suspected session of the caller first: it is the news the caller most needs to hear.
        sessions = [m for m in self.swim.members.values() if m.peer == peer]
        sessions.sort(key=lambda m: m.status is not Status.SUSPECT)
        return sessions[0].session if sessions else None

    async def rpc_probe(self, stream: Stream) -> None:
        """Answer a ping or run a ping-req."""
        caller = stream.remote_peer
        self.confirm_alive(caller)
        with contextlib.suppress(OpenTelaError, asyncio.IncompleteReadError):
            msg = await read_msg(stream, MAX_PROBE_MESSAGE)
            if isinstance(msg, dict):
                self._take_updates(msg.get("u"))
                reply = await self._answer_probe(msg)
                if reply is not None:
                    if updates := self._updates_for(self._session_of(caller)):
                        reply["u"] = updates
                    await write_msg(stream, reply)
        await stream.aclose()

    async def _answer_probe(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        if "q" in msg:
            held = self.registry.get(msg["q"]) if isinstance(msg["q"], str) else None
            return {"l": int(held is not None and held.lifecycle is Lifecycle.LEFT)}
        if "p" in msg:
            return {"a": self.swim.incarnation} if msg["p"] == self.swim.session else {"x": 1}
        target, peer = msg.get("r"), msg.get("w")
        if isinstance(target, str) and isinstance(peer, str) and peer != self.host.peer_id:
            member = self.swim.members.get(target) or Member(target, peer)
            answer = await self.call_ping(member, timeout=self.config.probe_timeout)
            if answer is not None and answer >= 0:
                self.swim.acked(target, answer, self.clock())
                return {"a": answer}
            return {"f": 1}
        return None

    # --- diagnostics --------------------------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Every watched session with its liveness, plus peers we are connected to without a live record."""
        now = self.clock()
        connected = set(self.host.connected_peers())
        out = []
        for member in sorted(self.swim.members.values(), key=lambda m: m.session):
            seen = self.last_seen.get(member.peer)
            out.append(
                {
                    "peer_id": member.peer,
                    "session_id": member.session,
                    "connected": member.peer in connected,
                    "suspected": member.status is Status.SUSPECT or member.peer in self.unreachable,
                    "incarnation": member.incarnation,
                    "suspected_for_s": round(now - member.suspected_at, 3)
                    if member.suspected_at is not None
                    else None,
                    "witnessed": member.witnessed,
                    "reason": self.unreachable.get(member.peer)
                    or ("probes failed" if member.status is Status.SUSPECT else None),
                    "last_seen_s_ago": round(now - seen, 3) if seen is not None else None,
                }
            )
        watched = {m.peer for m in self.swim.members.values()}
        for peer in sorted(connected - watched - {self.host.peer_id}):
            seen = self.last_seen.get(peer)
            out.append(
                {
                    "peer_id": peer,
                    "session_id": None,
                    "connected": True,
                    "suspected": False,
                    "incarnation": None,
                    "suspected_for_s": None,
                    "witnessed": False,
                    "reason": None,
                    "last_seen_s_ago": round(now - seen, 3) if seen is not None else None,
                }
            )
        return out

    def stats(self) -> dict[str, Any]:
        """SWIM counters."""
        return {
            **self.counters,
            "incarnation": self.swim.incarnation,
            "members": len(self.swim.members),
            "suspected": len(self.swim.suspected()),
            "pending_news": self.swim.pending_news(),
            "watched": len(self.swim.members) if (watched := self.watched()) is None else len(watched),
            "evictions_pending": len(self.evidence),
            "local_health": self.health.score,
            "loop_lag_s": round(self.loop_lag.worst_since(self.loop_lag.clock() - self.loop_lag.window), 3),
        }


def _answer(reply: dict[str, Any] | None) -> int | None:
    if reply is None:
        return None
    if "x" in reply:
        return NOT_THAT_SESSION
    inc = reply.get("a")
    if isinstance(inc, int) and not isinstance(inc, bool) and inc >= 0:
        return inc
    return None
