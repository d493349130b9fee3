"""SWIM over the simulated network: `membership.py`'s protocol period, probes, ping-req and evidence for evictions.

The state machine is the real one (`SwimState`, through `TrackedSwim`); this module is the event-driven twin of
the asyncio driver. One protocol period (`probe_interval`, jittered by 10 %): evict members whose suspicion
outlived its grace (only those we saw failing ourselves, and only while some other member answered us within
it), ping suspects, probe the next member of the round robin. With partial views the round robin and the
helpers are the neighbours' sessions, and a suspect heard of from others is pinged once, at a random moment
within half the suspicion timeout. A probe pings directly, waits `probe_timeout`, then asks `indirect_probes`
helpers (ping-req) and waits `indirect_timeout`; only when every path stayed silent is the member suspected.
Piggybacked updates ride on every ping, ack and ping-req, as the real messages carry them.

An eviction another member signed merges only with evidence, as `Membership.check_eviction` decides: the session
is not live here, this node's own latest probe of it failed, or `eviction_quorum` members signed one. Otherwise it
is held, the session is probed at once, and the hold is released on a failed probe or refused after
`eviction_hold`. No node's event loop stalls in the simulation, so local health moves only on refutations and
successful probes (Lifeguard's multiplier stays 1 in a healthy run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentela._types import PeerId, SessionId
from opentela.registry.local_health import LocalHealth
from opentela.registry.sim.members import FastShuffle, TrackedSwim
from opentela.registry.sim.network import PROBE
from opentela.registry.swim import Member, Status, Update

if TYPE_CHECKING:
    from opentela.registry.sim.node import SimNode

NOT_THAT_SESSION = -1
MAX_CHECKS = 16  # membership.py: heard-of suspects pinged once at the same time

Answer = Callable[["_Probe", int | None], None]


class _Probe:
    """One probe under way: 0 direct, 1 indirect, 2 done."""

    __slots__ = ("caller", "member", "on_answer", "phase", "relay")

    def __init__(self, member: Member, on_answer: Answer) -> None:
        self.member = member
        self.on_answer = on_answer
        self.phase = 0
        self.caller = -1  # ping-req: the node that asked us
        self.relay: _Probe | None = None  # ping-req: the asker's probe


class SimMembership:
    """One node's SWIM driver."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        mesh = node.mesh
        self.mesh = mesh
        self.config = mesh.registry_config
        self.swim = TrackedSwim(
            node.session_id,
            suspicion_timeout=self.config.suspicion_timeout,
            retransmit_mult=self.config.retransmit_mult,
            rng=FastShuffle(node.rng.getrandbits(63)),
        )
        self.swim.on_suspect = self._suspected
        self.health = LocalHealth(self.config.local_health_limit)
        self._refutations_seen = 0
        self.unreachable: set[int] = set()
        self.silent: dict[SessionId, float] = {}
        self.probing: set[SessionId] = set()
        self.checked: dict[SessionId, int] = {}  # heard-of suspects pinged once, at that incarnation
        self.checking: set[SessionId] = set()
        self.held: dict[SessionId, dict[int, int]] = {}  # session -> signer -> rank of its eviction
        self.held_since: dict[SessionId, float] = {}
        self._heard: list[tuple[int, float]] = [(-1, -1e300), (-1, -1e300)]  # two latest distinct peers
        self.counters: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<SimMembership {self.swim!r}>"

    def start(self, phase: float) -> None:
        """Start the protocol period `phase` seconds from now."""
        self.mesh.loop.call_later(phase, self._period)

    # --- hearing from peers ---------------------------------------------------------------------------------
    def confirm_alive(self, peer: int) -> None:
        """We heard from `peer`."""
        now = self.mesh.loop.now
        first = self._heard[0]
        if first[0] == peer:
            self._heard[0] = (peer, now)
        else:
            self._heard = [(peer, now), first]
        self.unreachable.discard(peer)

    def _in_touch(self, suspect: int, now: float) -> bool:
        """Whether some other node answered us within the suspicion timeout (`Membership._in_touch`)."""
        horizon = now - self.config.suspicion_timeout
        if len(self.swim.members) <= 1:
            return True
        return any(peer != suspect and at >= horizon for peer, at in self._heard)

    def _suspected(self, session: SessionId) -> None:
        self.mesh.routing_excludes(self.node.index, session)

    def suspect(self, peer: int) -> None:
        """A transport failure: avoid `peer` and probe its sessions at once."""
        self.unreachable.add(peer)
        for sid in self.mesh.node_sessions[peer]:
            self.mesh.routing_excludes(self.node.index, sid)
            member = self.swim.members.get(sid)
            if member is not None and sid not in self.probing:
                self.probe(member)

    def is_suspected(self, peer: int) -> bool:
        """Whether routing and gossip should avoid `peer`: unreachable, or all its sessions suspected."""
        if peer in self.unreachable:
            return True
        suspects = self.swim.suspects
        if not suspects:
            return False
        statuses = [sid in suspects for sid in self.mesh.node_sessions[peer] if sid in self.swim.members]
        return bool(statuses) and all(statuses)

    # --- the protocol period --------------------------------------------------------------------------------
    def watched(self) -> dict[SessionId, None] | None:
        """The sessions this node probes: its neighbours' and those of peers it marked unreachable (None in a
        full mesh: every member)."""
        neighbours = self.node.overlay.neighbours(self.node)
        if neighbours is None:
            return None
        members = self.swim.members
        node_sessions = self.mesh.node_sessions
        peers = (*neighbours, *self.unreachable) if self.unreachable else neighbours
        # An insertion-ordered dict, not a set: the round robin is drawn from its order, which must not depend on
        # PYTHONHASHSEED.
        return dict.fromkeys(s for peer in peers for s in node_sessions[peer] if s in members)

    def _period(self) -> None:
        node = self.node
        if not node.alive:
            return
        loop = self.mesh.loop
        loop.call_later(self.config.probe_interval * (0.9 + 0.2 * node.rng.random()), self._period)
        self.tick()
        watched = self.watched()
        target = self.swim.next_target(watched)
        # Suspects we watch (or saw failing) get a direct ping every period; one we only heard of gets one ping,
        # at a random moment within half the suspicion timeout, so we hold evidence when the eviction comes.
        for member in self.swim.suspected():
            if member is target or member.session in self.probing:
                continue
            if watched is None or member.session in watched or member.witnessed:
                self._ping_only(member)
            elif self.checked.get(member.session) != member.incarnation and len(self.checking) < MAX_CHECKS:
                self.checked[member.session] = member.incarnation
                self.checking.add(member.session)
                delay = node.rng.uniform(0.0, self.swim.suspicion_timeout / 2)
                loop.call_later(delay, self._check_once, member)
        if target is not None and target.session not in self.probing:
            self.probe(target)

    def _check_once(self, member: Member) -> None:
        self.checking.discard(member.session)
        if self.node.alive and self.swim.is_suspected(member.session) and member.session not in self.probing:
            self._ping_only(member)

    def tick(self) -> None:
        """Bookkeeping of one period: local health, held evictions, evictions that are due."""
        swim = self.swim
        if swim.refutations > self._refutations_seen:
            self._refutations_seen = swim.refutations
            self.health.degrade()
        swim.suspicion_timeout = self.config.suspicion_timeout * self.health.multiplier
        now = self.mesh.loop.now
        if self.unreachable:
            members = swim.members
            node_sessions = self.mesh.node_sessions
            for peer in [p for p in self.unreachable if not any(s in members for s in node_sessions[p])]:
                self.unreachable.discard(peer)
        if self.checked:
            for session in [s for s in self.checked if not swim.is_suspected(s)]:
                del self.checked[session]
        if self.held:
            self._recheck(now)
        self.evict_due()

    def evict_due(self) -> None:
        """Evict the sessions we saw failing whose grace is over (`Membership.evict_due`)."""
        if not self.node.alive:
            return
        swim = self.swim
        now = self.mesh.loop.now
        for member in swim.due_evictions(now):
            if not member.witnessed and not self._failed_here(member.session, now):
                continue  # heard of, never seen failing here: the witnesses write the eviction
            peer = self.mesh.node_index[member.peer]
            if not self._in_touch(peer, now):
                self.counters["evictions_held"] += 1
                continue
            swim.remove(member.session)
            if self.node.evict(member.session):
                self.counters["evictions"] += 1

    # --- probes -------------------------------------------------------------------------------------------
    def probe(self, member: Member) -> None:
        """Probe one member: directly, then through helpers."""
        self.probing.add(member.session)
        probe = _Probe(member, self._probe_answered)
        self._call_ping(member, probe)
        timeout = self.config.probe_timeout * self.health.multiplier
        self.mesh.loop.call_later(timeout, self._direct_timeout, probe)

    def _ping_only(self, member: Member) -> None:
        self.probing.add(member.session)
        probe = _Probe(member, self._ping_answered)
        self._call_ping(member, probe)
        self.mesh.loop.call_later(self.config.probe_timeout, self._ping_timeout, probe)

    def _call_ping(self, member: Member, probe: _Probe) -> None:
        self.counters["probes_sent"] += 1
        updates = self.swim.piggyback(member.session, self.config.max_piggyback)
        target = self.mesh.node_index[member.peer]
        sizes = self.mesh.sizes
        nbytes = sizes.flight(sizes.syn_probe + sizes.ping[len(updates)])
        peer = self.mesh.nodes[target].membership
        self.mesh.net.send(
            self.node.index,
            target,
            nbytes,
            PROBE,
            peer.rpc_ping,
            self.node.index,
            member.session,
            updates,
            probe,
        )

    def rpc_ping(self, caller: int, session: SessionId, updates: list[Update], probe: _Probe) -> None:
        """Answer a ping: our incarnation, or "not that session"."""
        self.confirm_alive(caller)
        self._take_updates(updates)
        answer = self.swim.incarnation if session == self.swim.session else NOT_THAT_SESSION
        reply = self.swim.piggyback(self._session_of(caller), self.config.max_piggyback)
        sizes = self.mesh.sizes
        size = sizes.ack[len(reply)] if answer >= 0 else sizes.not_that
        _, nbytes = sizes.probe_like(0, size)
        back = self.mesh.nodes[caller].membership
        self.mesh.net.send(
            self.node.index, caller, nbytes, PROBE, back.on_reply, self.node.index, answer, reply, probe
        )

    def on_reply(self, peer: int, answer: int, updates: list[Update], probe: _Probe) -> None:
        """An answer to one of our pings (or ping-reqs) arrived."""
        if probe.phase == 2 or not self.node.alive:
            return  # the real exchange gave up waiting and never read it
        self.confirm_alive(peer)
        self._take_updates(updates)
        probe.on_answer(probe, answer)

    def _probe_answered(self, probe: _Probe, answer: int | None) -> None:
        if probe.phase == 0:
            self._finish(probe, answer)

    def _direct_timeout(self, probe: _Probe) -> None:
        if probe.phase != 0 or not self.node.alive:
            return
        probe.phase = 1
        helpers = self.swim.helpers(probe.member, self.config.indirect_probes, self.watched())
        if not helpers:
            self._finish(probe, None)
            return
        self.counters["indirect_probes_sent"] += len(helpers)
        sizes = self.mesh.sizes
        target = probe.member
        for helper in helpers:
            updates = self.swim.piggyback(helper.session, self.config.max_piggyback)
            nbytes = sizes.flight(sizes.syn_probe + sizes.ping_req[len(updates)])
            h = self.mesh.node_index[helper.peer]
            self.mesh.net.send(
                self.node.index,
                h,
                nbytes,
                PROBE,
                self.mesh.nodes[h].membership.rpc_ping_req,
                self.node.index,
                target.session,
                target.peer,
                updates,
                probe,
            )
        timeout = self.config.indirect_timeout * self.health.multiplier
        self.mesh.loop.call_later(timeout, self._indirect_timeout, probe)

    def _indirect_answer(self, probe: _Probe, answer: int | None) -> None:
        if probe.phase == 1 and answer is not None and answer >= 0:
            self._finish(probe, answer)

    def _indirect_timeout(self, probe: _Probe) -> None:
        if probe.phase == 1 and self.node.alive:
            self._finish(probe, None)

    def _finish(self, probe: _Probe, answer: int | None) -> None:
        probe.phase = 2
        session = probe.member.session
        self.probing.discard(session)
        now = self.mesh.loop.now
        if answer is None or answer == NOT_THAT_SESSION:
            self.counters["probes_failed"] += 1
            self.silent[session] = now
            member = probe.member
            first_hand = not member.witnessed or member.status is not Status.SUSPECT
            self.swim.probe_failed(session, now)
            if first_hand and member.suspected_at is not None:
                # Written when the grace ends, not at the protocol period after it (`Membership._evict_when_due`).
                self.mesh.loop.call_at(member.suspected_at + self.swim.suspicion_timeout, self.evict_due)
        else:
            self.silent.pop(session, None)
            self.swim.acked(session, answer, now)
            self.health.improve()
        if session in self.held:
            self._recheck(now)

    def _ping_answered(self, probe: _Probe, answer: int | None) -> None:
        if probe.phase != 0:
            return
        probe.phase = 2
        session = probe.member.session
        self.probing.discard(session)
        if answer is not None and answer >= 0:
            self.silent.pop(session, None)
            self.swim.acked(session, answer, self.mesh.loop.now)
        if session in self.held:
            self._recheck(self.mesh.loop.now)

    def _ping_timeout(self, probe: _Probe) -> None:
        if probe.phase != 0 or not self.node.alive:
            return
        probe.phase = 2
        session = probe.member.session
        self.probing.discard(session)
        self.silent[session] = self.mesh.loop.now
        if session in self.held:
            self._recheck(self.mesh.loop.now)

    # --- ping-req, as the helper ----------------------------------------------------------------------------
    def rpc_ping_req(
        self, caller: int, session: SessionId, peer: PeerId, updates: list[Update], asked: _Probe
    ) -> None:
        """Ping `session` for `caller` and tell it what we heard (or that we heard nothing)."""
        self.confirm_alive(caller)
        self._take_updates(updates)
        member = self.swim.members.get(session) or Member(session, peer)
        relay = _Probe(member, self._relay_answer)
        relay.caller, relay.relay = caller, asked
        self._call_ping(member, relay)
        self.mesh.loop.call_later(self.config.probe_timeout, self._relay_timeout, relay)

    def _relay_answer(self, relay: _Probe, answer: int | None) -> None:
        if relay.phase != 0:
            return
        relay.phase = 2
        if answer is not None and answer >= 0:
            self.swim.acked(relay.member.session, answer, self.mesh.loop.now)
            self._relay_reply(relay, answer)
        else:
            self._relay_reply(relay, None)

    def _relay_timeout(self, relay: _Probe) -> None:
        if relay.phase == 0 and self.node.alive:
            relay.phase = 2
            self._relay_reply(relay, None)

    def _relay_reply(self, relay: _Probe, answer: int | None) -> None:
        caller = relay.caller
        reply = self.swim.piggyback(self._session_of(caller), self.config.max_piggyback)
        sizes = self.mesh.sizes
        size = sizes.ack[len(reply)] if answer is not None else sizes.nack
        _, nbytes = sizes.probe_like(0, size)
        asked = relay.relay
        assert asked is not None
        back = self.mesh.nodes[caller].membership
        self.mesh.net.send(
            self.node.index,
            caller,
            nbytes,
            PROBE,
            back.on_helper_reply,
            self.node.index,
            answer,
            reply,
            asked,
        )

    def on_helper_reply(self, peer: int, answer: int | None, updates: list[Update], probe: _Probe) -> None:
        """A helper's answer to our ping-req arrived."""
        if probe.phase != 1 or not self.node.alive:
            return
        self.confirm_alive(peer)
        self._take_updates(updates)
        self._indirect_answer(probe, answer)

    # --- news ---------------------------------------------------------------------------------------------
    def _take_updates(self, updates: list[Update]) -> None:
        if not updates:
            return
        now = self.mesh.loop.now
        before = self.swim.incarnation
        for update in updates[: self.config.max_piggyback * 2]:
            self.swim.apply(update, now)
        if self.swim.incarnation != before:
            self.counters["refutations"] += 1

    def _session_of(self, peer: int) -> SessionId | None:
        """The caller's session to carry news for: a suspected one first (`Membership._session_of`)."""
        sessions = [s for s in self.mesh.node_sessions[peer] if s in self.swim.members]
        if not sessions:
            return None
        suspects = self.swim.suspects
        sessions.sort(key=lambda s: s not in suspects)
        return sessions[0]

    # --- evictions signed by others -------------------------------------------------------------------------
    def check_eviction(self, session: SessionId, rank: int, signer: int, live_here: bool) -> bool:
        """Whether another member's eviction of `session` may merge now; otherwise it is held."""
        own = session == self.swim.session
        if not own and not live_here:
            self._take_held(session)
            return True
        if not own and self._has_evidence(session):
            self.counters["evictions_confirmed"] += 1
            self._take_held(session)
            return True
        held = self.held.setdefault(session, {})
        new = signer not in held
        held[signer] = max(rank, held.get(signer, -1))
        self.held_since.setdefault(session, self.mesh.loop.now)
        if len(held) >= self.config.eviction_quorum:
            self.counters["evictions_quorum"] += 1
            self._take_held(session)
            return True
        if new:
            self.counters["evictions_unconfirmed"] += 1
        if not own and session not in self.probing:
            member = self.swim.members.get(session)
            if member is not None:
                self.probe(member)
            else:
                peer = self.mesh.node_index_of_session(session)
                self._ping_only(Member(session, self.mesh.peer_ids[peer]))
        return False

    def _has_evidence(self, session: SessionId) -> bool:
        member = self.swim.members.get(session)
        if member is not None and member.status is Status.SUSPECT and member.witnessed:
            return True
        return self._failed_here(session, self.mesh.loop.now)

    def _failed_here(self, session: SessionId, now: float) -> bool:
        failed_at = self.silent.get(session)
        return failed_at is not None and now - failed_at <= self.config.eviction_hold

    def _take_held(self, session: SessionId) -> dict[int, int]:
        self.held_since.pop(session, None)
        return self.held.pop(session, {})

    def _recheck(self, now: float) -> None:
        for session in list(self.held):
            since = self.held_since.get(session, now)
            if now - since > self.config.eviction_hold:
                self.counters["evictions_refused"] += 1
                self._take_held(session)
            elif session != self.swim.session and self._has_evidence(session):
                self.counters["evictions_confirmed"] += 1
                ranks = self._take_held(session)
                self.node.release_evictions(session, ranks)

    def stats(self) -> dict[str, Any]:
        """Counters, as `Membership.stats` names them."""
        return {**self.counters, "members": len(self.swim.members), "suspected": len(self.swim.suspects)}
