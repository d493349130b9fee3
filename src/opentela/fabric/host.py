"""The Host: a node's endpoint on the fabric (listen, dial, one connection per peer, stream handlers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from opentela._tasks import TaskSet
from opentela._types import PROTO_RELAY, PeerId, ProtocolName, Stream
from opentela.errors import (
    AdmissionError,
    ConnectionClosedError,
    DialTimeout,
    FabricError,
    HandshakeError,
    OpenTelaError,
    PeerUnreachableError,
)
from opentela.fabric._config import FabricConfig
from opentela.fabric._frames import ErrorCode
from opentela.fabric.addresses import format_addr, parse_addr
from opentela.fabric.admission import Admission, admission_from_config
from opentela.fabric.bootstrap import bootstrap
from opentela.fabric.connection_manager import BOOTSTRAP, RELAY, ConnectionManager
from opentela.fabric.dialing import Target, race
from opentela.fabric.handshake import check_server_certificate, client_handshake, server_handshake
from opentela.fabric.identity import Identity
from opentela.fabric.join_tokens import Grant
from opentela.fabric.mux import MuxConnection
from opentela.fabric.relay import (
    RelayService,
    StreamTransport,
    is_circuit,
    relay_of,
    request_circuit,
    request_dial_back,
    request_reservation,
)
from opentela.fabric.stream import MuxStream
from opentela.fabric.tls import TlsMaterial

logger = logging.getLogger(__name__)

Handler = Callable[[Stream], Awaitable[None]]
_CLOSE_TIMEOUT = 2.0
_NEVER = 10 * 365 * 86400.0  # token expiries further away than this are not worth a timer (nor its overflow)


def _ignore_task_error(task: asyncio.Task[Any], exc: BaseException) -> None:
    """Retrieve and drop: a failed dial is reported to whoever awaited it, if anyone."""


class Host:
    """Listens for peers, dials them, keeps one connection per peer and runs stream handlers.

    Use as `async with await Host.create(identity) as host:` or call `aclose()`; it owns every task it starts.
    """

    def __init__(
        self, identity: Identity, config: FabricConfig, tls: TlsMaterial, admission: Admission | None = None
    ) -> None:
        self.identity = identity
        self.peer_id: PeerId = identity.peer_id
        self.config = config
        self.admission = admission or Admission.open()
        self.refused_not_member = 0
        self.listen_addrs: list[str] = []
        self._tls = tls
        self._loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None
        self._handlers: dict[ProtocolName, Handler] = {}
        self._serve_now: dict[ProtocolName, Callable[[Stream], bool]] = {}
        self._conns: dict[PeerId, MuxConnection] = {}
        self._live: set[MuxConnection] = set()
        self._dialing: dict[Any, asyncio.Task[PeerId]] = {}
        # Dial errors reach whoever awaits the dial; handler errors are logged by the handler runner.
        self._tasks = TaskSet("fabric", on_error=_ignore_task_error)
        self._timers: set[asyncio.TimerHandle] = set()
        self._expiry: dict[MuxConnection, asyncio.TimerHandle] = {}
        self._announced: set[PeerId] = set()
        self._on_connected: list[Callable[[PeerId], None]] = []
        self._on_disconnected: list[Callable[[PeerId], None]] = []
        self.connections = ConnectionManager(config)
        """Keeps the connection count between the watermarks; `protect` peers that must stay connected."""
        self.relay = RelayService(
            self,
            serve=config.relay_serve,
            max_reservations=config.relay_max_reservations,
            max_circuits=config.relay_max_circuits,
            dial_back_limit=config.dial_back_limit,
            dial_back_window=config.dial_back_window,
        )
        self._handlers[PROTO_RELAY] = self.relay.rpc_relay
        self._closed = False

    @classmethod
    async def create(
        cls,
        identity: Identity,
        listen: str = "127.0.0.1:0",
        *,
        config: FabricConfig | None = None,
        admission: Admission | None = None,
    ) -> Host:
        """Bind `listen` ("host:port", port 0 for any) and start accepting peers (all, or members only)."""
        config = config or FabricConfig()
        tls = await asyncio.to_thread(TlsMaterial.create, identity)
        host = cls(identity, config, tls, admission or admission_from_config(config, identity))
        bind_host, port, _ = parse_addr(listen)
        # Plain TCP: each MuxConnection runs TLS itself (see tls.TlsSession for why).
        host._server = await host._loop.create_server(
            host._inbound_protocol, bind_host or None, port, reuse_address=True
        )
        host.listen_addrs = [format_addr(*sock.getsockname()[:2]) for sock in host._server.sockets]
        logger.info("fabric listening", extra={"peer_id": host.peer_id, "addrs": ",".join(host.listen_addrs)})
        host._log_admission()
        return host

    def _log_admission(self) -> None:
        own = self.admission.own
        if own is None:
            logger.info("open network: any peer may join")
            return
        grant = own.grant
        logger.info(
            "closed network %s: only members with a valid join token may connect",
            grant.network_id,
            extra={
                "network_id": grant.network_id,
                "provider": grant.provider_id,
                "token_expires": grant.describe()["expires_at"],
            },
        )

    async def __aenter__(self) -> Host:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Host {self.peer_id[-8:]} listen={','.join(self.listen_addrs)} peers={len(self._conns)}>"

    # --- public surface -------------------------------------------------------------------------------------
    def set_handler(
        self, protocol: ProtocolName, handler: Handler, now: Callable[[Stream], bool] | None = None
    ) -> None:
        """Serve `protocol`: each inbound stream naming it runs `handler(stream)` in its own task.

        `now(stream)`, if given, is tried first, as the stream's opening frame is read: True when it took the stream
        on without a task (it must not wait, and answers later from callbacks); False to leave it to `handler`."""
        self._handlers[protocol] = handler
        if now is None:
            self._serve_now.pop(protocol, None)
        else:
            self._serve_now[protocol] = now

    def on_peer_connected(self, callback: Callable[[PeerId], None]) -> None:
        """Call `callback(peer_id)` when we gain a connection to a peer we were not connected to."""
        self._on_connected.append(callback)

    def on_peer_disconnected(self, callback: Callable[[PeerId], None]) -> None:
        """Call `callback(peer_id)` when our connection to a peer is lost or closed."""
        self._on_disconnected.append(callback)

    def is_connected(self, peer_id: PeerId) -> bool:
        """True if a live connection to `peer_id` exists."""
        conn = self._conns.get(peer_id)
        return conn is not None and conn.usable

    def connected_peers(self) -> list[PeerId]:
        """Peers with a live connection."""
        return [pid for pid, conn in self._conns.items() if conn.usable]

    def connection(self, peer_id: PeerId) -> MuxConnection | None:
        """The connection to `peer_id`, if any (for diagnostics)."""
        return self._conns.get(peer_id)

    async def connect(
        self, addr: str, *, peer_id: PeerId | None = None, timeout: float | None = None
    ) -> PeerId:
        """Connect to the peer at `addr` (reusing a live connection) and return its peer id.

        Raises HandshakeError (wrong key or refused), PeerUnreachableError, DialTimeout; ValueError for a
        malformed address.
        """
        host, port, in_addr = parse_addr(addr)
        if peer_id is not None and in_addr is not None and peer_id != in_addr:
            raise ValueError(f"address {addr!r} names peer {in_addr}, not {peer_id}")
        return await self._connect(peer_id or in_addr, [(host, port, in_addr)], timeout)

    async def open_stream(
        self,
        peer_id: PeerId,
        protocol: ProtocolName,
        *,
        addrs: Sequence[str] = (),
        timeout: float | None = None,
    ) -> Stream:
        """A new stream to `peer_id` speaking `protocol`, dialing one of `addrs` if not connected."""
        conn = self._conns.get(peer_id)
        if conn is not None and conn.usable:
            return conn.open_stream(protocol)  # the hot path: no await, no allocation beyond the stream
        targets: list[Target] = []
        circuits = [a for a in addrs if is_circuit(a)]
        for addr in addrs:
            if is_circuit(addr):
                continue
            try:
                host, port, in_addr = parse_addr(addr)
            except ValueError as exc:
                logger.debug("skipping bad address %r of %s: %s", addr, peer_id, exc)
                continue
            if in_addr is None or in_addr == peer_id:
                targets.append((host, port, peer_id))
        if not targets and not circuits and peer_id not in self._dialing:
            raise PeerUnreachableError(f"not connected to {peer_id} and no address to dial", peer_id=peer_id)
        if targets or not circuits:
            try:
                await self._connect(peer_id, targets, timeout)
            except (PeerUnreachableError, DialTimeout):
                if not circuits:
                    raise
                await self._connect_relayed(peer_id, circuits, timeout)
        else:
            await self._connect_relayed(peer_id, circuits, timeout)
        conn = self._conns.get(peer_id)
        if conn is None or not conn.usable:
            raise PeerUnreachableError(f"the connection to {peer_id} closed right after it opened")
        return conn.open_stream(protocol)

    async def bootstrap(
        self,
        addrs: Sequence[str],
        *,
        initial_delay: float = 0.5,
        max_delay: float = 30.0,
        attempts: int | None = None,
    ) -> list[PeerId]:
        """Connect to every address that answers, retrying with backoff until at least one does.

        Retries forever when `attempts` is None; otherwise raises PeerUnreachableError after that many rounds.
        Addresses that turn out to be this node are dropped; if none is left, returns [].
        Every peer reached is protected (tag "bootstrap") from the connection limits.
        """

        async def connect(addr: str) -> PeerId:
            peer_id = await self.connect(addr)
            self.connections.protect(peer_id, BOOTSTRAP)
            return peer_id

        return await bootstrap(
            connect, addrs, initial_delay=initial_delay, max_delay=max_delay, attempts=attempts
        )

    async def aclose(self) -> None:
        """Stop listening, cancel handlers and dials, say goodbye on every connection and close it."""
        if self._closed:
            return
        self._closed = True
        self.connections.close()
        if self._server is not None:
            self._server.close()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        await self._tasks.aclose(timeout=_CLOSE_TIMEOUT)
        conns = list(self._live)
        for conn in conns:
            conn.close(ErrorCode.NO_ERROR, "host shutting down")
        if conns:
            _, stuck = await asyncio.wait([c.lost for c in conns], timeout=_CLOSE_TIMEOUT)
            for conn in conns:
                if not conn.lost.done():
                    conn.abort()
            if stuck:
                await asyncio.wait(stuck, timeout=_CLOSE_TIMEOUT)
        if self._server is not None:
            await self._server.wait_closed()
        logger.info("fabric closed", extra={"peer_id": self.peer_id})

    # --- tasks ----------------------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, name)

    # --- inbound --------------------------------------------------------------------------------------------
    def _new_conn(self, initiator: bool) -> MuxConnection:
        return MuxConnection(
            self.config,
            self._tls.client_context if initiator else self._tls.server_context,
            initiator=initiator,
            on_stream=self._on_stream,
            on_goaway=self._on_goaway,
            on_close=self._on_close,
            on_made=self._on_made,
        )

    def _on_made(self, conn: MuxConnection) -> None:
        self._live.add(conn)
        if self._closed:
            conn.abort()

    def _inbound_protocol(self) -> MuxConnection:
        conn = self._new_conn(initiator=False)
        conn.on_secure = self._on_inbound_secure
        return conn

    def _on_inbound_secure(self, conn: MuxConnection) -> None:
        if not self._closed:
            self._spawn(self._accept(conn), "fabric-accept")

    async def _accept(self, conn: MuxConnection) -> None:
        try:
            async with asyncio.timeout(self.config.handshake_timeout):
                peer_id, grant = await server_handshake(
                    conn, self._tls.certificate, self.peer_id, self.admission
                )
        except AdmissionError as exc:
            self.refused_not_member += 1
            where = conn.get_extra_info("peername")
            if exc.details.get("by_peer"):
                logger.warning("inbound connection from %s ended: %s", where, exc)
            else:
                logger.warning("refused inbound peer from %s: %s", where, exc)
            conn.close(ErrorCode.PROTOCOL_ERROR, "not admitted")
            return
        except (HandshakeError, TimeoutError, OSError) as exc:
            logger.info(
                "inbound handshake from %s failed: %s", conn.get_extra_info("peername"), exc or "timeout"
            )
            conn.close(ErrorCode.PROTOCOL_ERROR, "handshake failed")
            return
        conn.start(peer_id)
        self._register(conn, grant)

    # --- outbound -------------------------------------------------------------------------------------------
    async def _connect(self, expected: PeerId | None, targets: list[Target], timeout: float | None) -> PeerId:
        if self._closed:
            raise ConnectionClosedError("the host is closed")
        if expected is not None:
            conn = self._conns.get(expected)
            if conn is not None and conn.usable:
                return expected
        key: Any = expected if expected is not None else targets[0][:2]
        task = self._dialing.get(key)
        timeout = self.config.dial_timeout if timeout is None else timeout
        if task is None:
            deadline = self._loop.time() + timeout
            task = self._spawn(self._dial(expected, targets, deadline), f"dial-{key}")
            self._dialing[key] = task
            task.add_done_callback(lambda t: self._forget_dial(key, t))
        try:
            async with asyncio.timeout(timeout):
                # Shielded: a caller giving up must not cancel the dial others are waiting for.
                return await asyncio.shield(task)
        except TimeoutError:
            who = expected or format_addr(*targets[0][:2])
            raise DialTimeout(f"connecting to {who} took over {timeout}s", peer_id=expected) from None

    def _forget_dial(self, key: Any, task: asyncio.Task[Any]) -> None:
        if self._dialing.get(key) is task:
            del self._dialing[key]

    async def _dial(self, expected: PeerId | None, targets: list[Target], deadline: float) -> PeerId:
        remaining = list(targets)
        errors: list[BaseException] = []
        while remaining:
            try:
                async with asyncio.timeout_at(deadline):
                    won = await race(lambda: self._new_conn(initiator=True), remaining, errors)
            except TimeoutError:
                errors.append(DialTimeout("timed out"))
                break
            if won is None:
                break
            conn, (host, port, _) = won
            try:
                return await self._finish_dial(conn, expected, deadline)
            except HandshakeError as exc:
                _drop(conn, exc)
                if exc.details.get("timeout"):
                    errors.append(DialTimeout(f"handshake with {format_addr(host, port)} timed out"))
                    break
                if not isinstance(exc, AdmissionError):  # _finish_dial logged that one already
                    logger.info("handshake with %s failed: %s", format_addr(host, port), exc)
                errors.append(exc)
                if exc.details.get("self_dial") or isinstance(exc, AdmissionError):
                    break
            except TimeoutError:
                conn.abort()
                errors.append(DialTimeout(f"handshake with {format_addr(host, port)} timed out"))
                break
            except BaseException:
                conn.abort()
                raise
        where = ", ".join(format_addr(h, p) for h, p, _ in targets)
        who = expected or where
        for error in errors:
            if isinstance(error, HandshakeError):
                raise error
        if any(isinstance(error, DialTimeout) for error in errors):
            raise DialTimeout(f"connecting to {who} at {where} timed out", peer_id=expected)
        reasons = "; ".join(str(e) for e in errors) or "no address"
        raise PeerUnreachableError(f"cannot reach {who} at {where}: {reasons}", peer_id=expected)

    async def _finish_dial(self, conn: MuxConnection, expected: PeerId | None, deadline: float) -> PeerId:
        certificate = conn.get_extra_info("ssl_object").getpeercert(binary_form=True)
        peer_id = check_server_certificate(certificate, expected, self.peer_id)
        existing = self._conns.get(peer_id)
        if existing is not None and existing.usable:
            conn.close()  # dialed by address and found we already have this peer
            return peer_id
        other = self._dialing.get(peer_id)
        current = asyncio.current_task()
        if expected is None and other is not None and other is not current:
            conn.close()  # another dial to the same peer is further along: share it
            return await asyncio.shield(other)
        if other is None and current is not None:
            # Dialed by address: from here on, dials naming this peer join ours instead of racing it.
            self._dialing[peer_id] = current
            current.add_done_callback(lambda t: self._forget_dial(peer_id, t))
        try:
            async with asyncio.timeout_at(deadline):
                grant = await client_handshake(
                    conn, self.identity, certificate or b"", self.admission, peer_id
                )
        except AdmissionError as exc:
            self.refused_not_member += 1
            if exc.details.get("by_peer"):
                logger.warning("not connected to %s: %s", peer_id, exc)
            else:
                logger.warning("refused to connect to %s: %s", peer_id, exc)
            raise
        conn.start(peer_id)
        self._register(conn, grant)
        return peer_id

    async def _connect_relayed(self, peer_id: PeerId, circuits: list[str], timeout: float | None) -> None:
        """Reach `peer_id` through the first relay that can connect us (direct dials failed or were impossible)."""
        timeout = self.config.dial_timeout if timeout is None else timeout
        errors = []
        for circuit in circuits:
            try:
                async with asyncio.timeout(timeout):
                    await self._dial_relayed(peer_id, relay_of(circuit), self._loop.time() + timeout)
                return
            except AdmissionError:
                raise  # the peer itself answered, end to end: another relay would hear the same
            except (OpenTelaError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                errors.append(f"{circuit}: {exc or 'timeout'}")
        raise PeerUnreachableError(f"no relay could reach {peer_id}: {'; '.join(errors)}", peer_id=peer_id)

    async def _dial_relayed(self, peer_id: PeerId, relay_addr: str, deadline: float) -> PeerId:
        relay_peer = await self.connect(relay_addr)
        stream = await self.open_stream(relay_peer, PROTO_RELAY)
        try:
            await request_circuit(stream, peer_id)
        except BaseException:
            stream.reset(0, "circuit refused")
            raise
        conn = self._new_conn(initiator=True)
        StreamTransport(stream, conn, relay_peer).start()
        try:
            await conn.secure
            if conn.error is not None:
                raise PeerUnreachableError(f"TLS through relay {relay_peer} failed: {conn.error}")
            peer = await self._finish_dial(conn, peer_id, deadline)
        except BaseException as exc:
            _drop(conn, exc)
            raise
        self.relay.relayed_out += 1
        return peer

    async def accept_relayed(self, stream: Stream, dialer: PeerId) -> None:
        """Run an inbound connection from `dialer` over a relayed stream until it ends."""
        conn = self._inbound_protocol()
        StreamTransport(stream, conn, stream.remote_peer).start()
        logger.info("relayed connection", extra={"peer_id": dialer, "relay": stream.remote_peer})
        await asyncio.shield(conn.lost)

    async def reserve_relay(self, relay_addr: str) -> PeerId:
        """Connect to the relay at `relay_addr` and hold a slot there (protected, tag "relay"); the relay's id."""
        relay_peer = await self.connect(relay_addr)
        stream = await self.open_stream(relay_peer, PROTO_RELAY)
        try:
            await request_reservation(stream)
            # The slot lives as long as this connection, and peers reach us through it.
            self.connections.protect(relay_peer, RELAY)
        finally:
            await stream.aclose()
        return relay_peer

    def remote_ip(self, peer_id: PeerId) -> str | None:
        """The IP our direct connection to `peer_id` comes from; None when not connected or relayed."""
        conn = self._conns.get(peer_id)
        where = conn.get_extra_info("peername") if conn is not None else None
        if not isinstance(where, tuple) or not where or where[0] == "relay":
            return None
        return str(where[0])

    async def check_reachable(self, peer_id: PeerId, addrs: Sequence[str]) -> list[str]:
        """Ask a connected peer which of our `addrs` it can open a new connection to."""
        stream = await self.open_stream(peer_id, PROTO_RELAY)
        try:
            return await request_dial_back(stream, list(addrs))
        finally:
            await stream.aclose()

    # --- connection bookkeeping -----------------------------------------------------------------------------
    def _register(self, conn: MuxConnection, grant: Grant | None = None) -> None:
        """Make `conn` the connection to its peer, or, if one exists, keep exactly one of the two."""
        peer_id = conn.remote_peer
        if self._closed:
            conn.close(ErrorCode.NO_ERROR, "host shutting down")
            return
        if not conn.usable:
            # The peer said goodbye in the very bytes that ended the handshake (a peer over its connection
            # limit does): nothing to adopt, and no one to tell it came or went.
            return
        delay = grant.expires_at - time.time() if grant is not None and grant.expires_at else _NEVER
        if delay < _NEVER:
            # Membership ends with the token: the connection does too (a renewed token means a new connection).
            self._expiry[conn] = self._loop.call_later(max(0.0, delay), self._membership_expired, conn)
        old = self._conns.get(peer_id)
        if old is not None and old.usable:
            if not self._keep_new(conn, old):
                logger.debug("duplicate connection to %s: keeping the older one", peer_id)
                conn.go_away(ErrorCode.DUPLICATE_CONNECTION, "duplicate connection")
                return
            logger.debug("duplicate connection to %s: keeping the newer one", peer_id)
            self._conns[peer_id] = conn
            old.go_away(ErrorCode.DUPLICATE_CONNECTION, "duplicate connection")
        else:
            self._conns[peer_id] = conn
        self.connections.connected(peer_id, conn)
        if peer_id not in self._announced:
            self._announced.add(peer_id)
            logger.info("peer connected", extra={"peer_id": peer_id, "dialer": conn.initiator})
            self._notify(self._on_connected, peer_id)

    def _membership_expired(self, conn: MuxConnection) -> None:
        if conn.error is None:
            logger.warning("the join token of %s expired: closing its connection", conn.remote_peer)
            conn.close(ErrorCode.NO_ERROR, "join token expired")

    def _keep_new(self, new: MuxConnection, old: MuxConnection) -> bool:
        # Both ends must pick the same survivor without talking: keep the connection dialed by the smaller
        # peer id. Two dialed by the same side mean it lost the old one (or never saw it finish): keep the new.
        new_dialer = self.peer_id if new.initiator else new.remote_peer
        old_dialer = self.peer_id if old.initiator else old.remote_peer
        return new_dialer < old_dialer if new_dialer != old_dialer else True

    def _on_goaway(self, conn: MuxConnection, code: int, message: str) -> None:
        peer_id = conn.remote_peer
        if self._conns.get(peer_id) is not conn:
            return
        del self._conns[peer_id]
        self.connections.disconnected(peer_id)
        if code == ErrorCode.DUPLICATE_CONNECTION:
            # The peer kept our other connection, which may not have finished its handshake here yet: give it
            # a moment before telling anyone the peer is gone.
            timer = self._loop.call_later(min(1.0, self.config.handshake_timeout), self._check_gone, peer_id)
            self._timers.add(timer)
        else:
            self._check_gone(peer_id)

    def _on_close(self, conn: MuxConnection) -> None:
        self._live.discard(conn)
        expiry = self._expiry.pop(conn, None)
        if expiry is not None:
            expiry.cancel()
        peer_id = conn.remote_peer
        if peer_id and self._conns.get(peer_id) is conn:
            del self._conns[peer_id]
            self.connections.disconnected(peer_id)
            self._check_gone(peer_id)

    def _check_gone(self, peer_id: PeerId) -> None:
        self._timers = {t for t in self._timers if not t.cancelled() and t.when() > self._loop.time()}
        if peer_id in self._conns or peer_id not in self._announced:
            return
        self._announced.discard(peer_id)
        logger.info("peer disconnected", extra={"peer_id": peer_id})
        self._notify(self._on_disconnected, peer_id)

    @staticmethod
    def _notify(callbacks: list[Callable[[PeerId], None]], peer_id: PeerId) -> None:
        for callback in list(callbacks):
            try:
                callback(peer_id)
            except Exception:
                logger.exception("peer callback %r failed for %s", callback, peer_id)

    # --- stream dispatch ------------------------------------------------------------------------------------
    def _on_stream(self, stream: MuxStream) -> None:
        handler = self._handlers.get(stream.protocol)
        if handler is None:
            stream.reset(ErrorCode.UNKNOWN_PROTOCOL, f"no handler for protocol {stream.protocol!r}")
            return
        if self._closed:
            stream.reset(ErrorCode.REFUSED_STREAM, "host shutting down")
            return
        now = self._serve_now.get(stream.protocol)
        if now is not None:
            try:
                if now(stream):
                    return
            except (
                Exception
            ) as exc:  # it runs inside the connection's reader: a bug must not take the link down
                logger.exception("handler for %s from %s failed", stream.protocol, stream.remote_peer)
                stream.reset(ErrorCode.INTERNAL_ERROR, f"handler failed: {type(exc).__name__}")
                return
        self._spawn(self._run_handler(handler, stream), f"handler-{stream.protocol}")

    async def _run_handler(self, handler: Handler, stream: MuxStream) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            stream.reset(ErrorCode.CANCEL, "handler cancelled")
            raise
        except (FabricError, asyncio.IncompleteReadError) as exc:
            # The stream or connection failed under the handler: nothing to report to anyone.
            logger.debug("handler for %r ended by %r", stream, exc)
            stream.reset(ErrorCode.CANCEL, "handler ended")
        except Exception as exc:
            logger.exception("handler for %s from %s failed", stream.protocol, stream.remote_peer)
            stream.reset(ErrorCode.INTERNAL_ERROR, f"handler failed: {type(exc).__name__}")
        else:
            try:
                await stream.aclose()
            except OpenTelaError:
                pass


def _drop(conn: MuxConnection, exc: BaseException) -> None:
    """Abort a failed dial, but let a refusal on admission grounds reach the peer first (it says why)."""
    if isinstance(exc, AdmissionError):
        conn.close(ErrorCode.PROTOCOL_ERROR, "not admitted")
    else:
        conn.abort()
