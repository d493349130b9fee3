"""Circuit relay over /otela/relay/1: reach a peer that accepts no inbound connections through one that does.

A private node keeps an outbound connection to a public peer and *reserves* a slot there. Another peer asks the
relay to *connect* it to the private node; the relay opens a stream to the private node over the reserved
connection and splices the two streams. The two ends then run the ordinary TLS + identity handshake and the
multiplexer end to end over the spliced bytes, so the relay can neither read nor forge what passes through it.

Messages (length-prefixed msgpack, see messages.py); every reply is {"ok": true, ...} or {"ok": false, "error": ...}:
  reserve:  private -> relay  {"t": "reserve"}                   reply {"ok": true, "ttl": s}
  connect:  dialer  -> relay  {"t": "connect", "to": PEERID}     reply, then raw bytes both ways
  incoming: relay -> private  {"t": "incoming", "from": PEERID}  reply, then raw bytes both ways
  dialback: any -> peer       {"t": "dialback", "addrs": [...]}  reply {"ok": true, "reachable": [...],
                                                                        "refused": [...]}
A dial-back only dials the asker's own addresses: the IP its direct connection comes from, or, for an asker on
this very host, this host's addresses; anything else is refused undialled, so no peer can use a node to probe
third hosts. Each peer gets a few dial-backs per window.
A circuit address is a relay address followed by "/p2p-circuit", e.g. "RELAYID@10.0.0.1:4001/p2p-circuit".
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import deque
from typing import Any

from opentela._types import PROTO_RELAY, PeerId, Stream
from opentela.errors import OpenTelaError, PeerUnreachableError
from opentela.fabric.addresses import parse_addr
from opentela.fabric.connection_manager import RELAY
from opentela.fabric.messages import read_msg, write_msg

logger = logging.getLogger(__name__)

CIRCUIT_SUFFIX = "/p2p-circuit"
DIAL_BACK_TIMEOUT = 2.0  # a firewalled port drops the SYN silently: give up after this long
_WRITE_HIGH = 512 * 1024  # bytes buffered in a StreamTransport before its protocol is asked to pause


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_local_ip(text: str) -> bool:
    """Whether `text` is an address of this host (loopback, or one a socket here can bind)."""
    ip = _ip(text)
    if ip is None:
        return False
    if ip.is_loopback:
        return True
    if ip.is_unspecified or ip.is_multicast:
        return False
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))  # EADDRNOTAVAIL unless the address is on one of our interfaces
    except OSError:
        return False
    return True


def owns_address(target: str, asker: str) -> bool:
    """Whether dialling IP `target` reaches the asker whose connection comes from IP `asker`.

    Its own IP, always; and when the asker runs on this host (it reached us over loopback or one of our
    addresses), this host's addresses too. Never another host, link-local or not.
    """
    target_ip, asker_ip = _ip(target), _ip(asker)
    if target_ip is None or asker_ip is None or target_ip.is_unspecified or target_ip.is_multicast:
        return False
    if target_ip == asker_ip:
        return True
    return is_local_ip(str(asker_ip)) and is_local_ip(str(target_ip))


def is_circuit(addr: str) -> bool:
    """Whether `addr` names a peer through a relay."""
    return addr.endswith(CIRCUIT_SUFFIX)


def circuit_addr(relay_addr: str) -> str:
    """The circuit address that reaches us through `relay_addr` ("RELAYID@host:port")."""
    return relay_addr + CIRCUIT_SUFFIX


def relay_of(addr: str) -> str:
    """The relay's own address inside a circuit address."""
    return addr[: -len(CIRCUIT_SUFFIX)]


class StreamTransport(asyncio.Transport):
    """An asyncio transport whose bytes travel on a fabric stream: lets a MuxConnection run through a relay."""

    def __init__(self, stream: Stream, protocol: asyncio.Protocol, relay: PeerId) -> None:
        super().__init__()
        self._stream = stream
        self._protocol = protocol
        self._extra = {"peername": ("relay", relay), "sockname": ("relay", relay)}
        self._out: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._closing = False
        self._lost = False
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def __repr__(self) -> str:
        return f"<StreamTransport over {self._stream!r} buffered={self._buffered}>"

    def start(self) -> None:
        """Hand ourselves to the protocol and start pumping bytes both ways."""
        self._protocol.connection_made(self)
        self._tasks = [
            asyncio.create_task(self._pump_in(), name="otela-relay-in"),
            asyncio.create_task(self._pump_out(), name="otela-relay-out"),
        ]

    async def _pump_in(self) -> None:
        try:
            while data := await self._stream.read():
                self._protocol.data_received(data)
            self._protocol.eof_received()
        except (OpenTelaError, asyncio.IncompleteReadError) as exc:
            logger.debug("relayed stream ended: %r", exc)
        self._connection_lost()

    async def _pump_out(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._out:
                    chunk = self._out.popleft()
                    await self._stream.write(chunk)
                    self._buffered -= len(chunk)
                if self._paused and self._buffered < _WRITE_HIGH // 2:
                    self._paused = False
                    self._protocol.resume_writing()
                if self._closing:
                    await self._stream.write_eof()
                    return
        except OpenTelaError as exc:
            logger.debug("relayed stream write failed: %r", exc)
            self._stream.reset(0, "relayed transport failed")
            self._connection_lost()

    def _connection_lost(self) -> None:
        if not self._lost:
            self._lost = True
            self._closing = True
            self._protocol.connection_lost(None)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue bytes; they go out in order on the stream."""
        if self._closing or not data:
            return
        self._out.append(bytes(data))
        self._buffered += len(data)
        self._wake.set()
        if not self._paused and self._buffered > _WRITE_HIGH:
            self._paused = True
            self._protocol.pause_writing()

    def is_closing(self) -> bool:
        """True once close or abort was called, or the stream ended."""
        return self._closing

    def close(self) -> None:
        """Flush what is queued, half-close the stream, and report the connection lost."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        asyncio.get_running_loop().call_soon(self._connection_lost)

    def abort(self) -> None:
        """Reset the stream at once."""
        self._closing = True
        self._stream.reset(0, "relayed connection aborted")
        for task in self._tasks:
            task.cancel()
        asyncio.get_running_loop().call_soon(self._connection_lost)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """peername/sockname name the relay; there is no socket of our own."""
        return self._extra.get(name, default)

    def get_write_buffer_size(self) -> int:
        """Bytes queued and not yet written to the stream."""
        return self._buffered


async def splice(a: Stream, b: Stream) -> None:
    """Copy bytes both ways until both directions end; a failure on either side resets both."""

    async def copy(src: Stream, dst: Stream) -> None:
        while data := await src.read():
            await dst.write(data)
        await dst.write_eof()

    try:
        await asyncio.gather(copy(a, b), copy(b, a))
    except (OpenTelaError, asyncio.IncompleteReadError) as exc:
        logger.debug("circuit ended: %r", exc)
        a.reset(0, "circuit closed")
        b.reset(0, "circuit closed")


async def request_reservation(stream: Stream) -> float:
    """Ask the relay on the other end of `stream` to keep a slot for us; returns the reservation's ttl."""
    await write_msg(stream, {"t": "reserve"})
    reply = await read_msg(stream, 4096)
    if not isinstance(reply, dict) or not reply.get("ok"):
        reason = reply.get("error") if isinstance(reply, dict) else "bad reply"
        raise PeerUnreachableError(f"relay {stream.remote_peer} refused a reservation: {reason}")
    return float(reply.get("ttl", 0))


async def request_dial_back(stream: Stream, addrs: list[str]) -> list[str]:
    """Ask the peer on the other end to open fresh connections to `addrs`; returns those that worked."""
    await write_msg(stream, {"t": "dialback", "addrs": addrs})
    reply = await read_msg(stream, 64 * 1024)
    if not isinstance(reply, dict) or not reply.get("ok") or not isinstance(reply.get("reachable"), list):
        reason = reply.get("error") if isinstance(reply, dict) else None
        raise PeerUnreachableError(f"{stream.remote_peer} did not answer the dial-back request: {reason}")
    reachable = [a for a in reply["reachable"] if isinstance(a, str)]
    if not reachable and reply.get("refused"):
        # It would not dial what it cannot tell is ours (another interface than the one we reached it from):
        # no verdict, rather than "unreachable".
        raise PeerUnreachableError(
            f"{stream.remote_peer} cannot check these addresses from where we reached it"
        )
    return reachable


async def request_circuit(stream: Stream, target: PeerId) -> None:
    """Ask the relay to connect `stream` to `target`; raises PeerUnreachableError if it cannot."""
    await write_msg(stream, {"t": "connect", "to": target})
    reply = await read_msg(stream, 4096)
    if not isinstance(reply, dict) or not reply.get("ok"):
        reason = reply.get("error") if isinstance(reply, dict) else "bad reply"
        raise PeerUnreachableError(f"relay {stream.remote_peer} cannot reach {target}: {reason}")


class RelayService:
    """Both roles of /otela/relay/1 on one host: relay for others (when public) and accept relayed dials."""

    def __init__(
        self,
        host: Any,
        *,
        serve: bool,
        max_reservations: int,
        max_circuits: int,
        dial_back_limit: int = 4,
        dial_back_window: float = 60.0,
    ) -> None:
        self.host = host
        self.serve = serve
        self.max_reservations = max_reservations
        self.max_circuits = max_circuits
        self.dial_back_limit = dial_back_limit
        self.dial_back_window = dial_back_window
        self.reservations: set[PeerId] = set()
        self.circuits = 0
        self.relayed_in = 0
        self.relayed_out = 0
        self.dial_backs = 0
        self.dial_back_refused = 0  # addresses not dialled: not the asker's own
        self.dial_back_rate_limited = 0
        self._dial_back_times: dict[PeerId, deque[float]] = {}
        host.on_peer_disconnected(self._forget)

    def __repr__(self) -> str:
        return f"<RelayService serve={self.serve} reservations={len(self.reservations)} circuits={self.circuits}>"

    def _forget(self, peer: PeerId) -> None:
        """A peer disconnected: its slot, which lived as long as its connection, is gone."""
        if peer in self.reservations:
            self.reservations.discard(peer)
            self.host.connections.unprotect(peer, RELAY)

    def stats(self) -> dict[str, int]:
        """Reservations held for others, circuits open through us, relayed connections in and out."""
        return {
            "reservations": len(self.reservations),
            "circuits": self.circuits,
            "relayed_in": self.relayed_in,
            "relayed_out": self.relayed_out,
            "dial_backs": self.dial_backs,
            "dial_back_refused": self.dial_back_refused,
            "dial_back_rate_limited": self.dial_back_rate_limited,
        }

    async def rpc_relay(self, stream: Stream) -> None:
        """Serve one /otela/relay/1 stream."""
        msg = await read_msg(stream, 4096)
        kind = msg.get("t") if isinstance(msg, dict) else None
        if kind == "reserve":
            await self._reserve(stream)
        elif kind == "connect":
            await self._connect(stream, msg.get("to"))
        elif kind == "incoming":
            await write_msg(stream, {"ok": True})
            self.relayed_in += 1
            await self.host.accept_relayed(stream, str(msg.get("from", "")))
        elif kind == "dialback":
            if self._dial_back_allowed(stream.remote_peer):
                reachable, refused = await self._dial_back(stream.remote_peer, msg.get("addrs"))
                await write_msg(stream, {"ok": True, "reachable": reachable, "refused": refused})
            else:
                await write_msg(stream, {"ok": False, "error": "too many dial-back requests; try later"})
        else:
            await write_msg(stream, {"ok": False, "error": f"unknown relay message {kind!r}"})

    def _dial_back_allowed(self, peer: PeerId) -> bool:
        """Count a dial-back request of `peer` against its limit; False when it is over."""
        now = time.monotonic()
        times = self._dial_back_times.setdefault(peer, deque())
        while times and times[0] < now - self.dial_back_window:
            times.popleft()
        for other in [p for p, t in self._dial_back_times.items() if not t and p != peer]:
            del self._dial_back_times[other]
        if len(times) >= self.dial_back_limit:
            self.dial_back_rate_limited += 1
            logger.warning("refused a dial-back request: over the limit", extra={"peer_id": peer})
            return False
        times.append(now)
        return True

    async def _dial_back(self, peer: PeerId, addrs: Any) -> tuple[list[str], list[str]]:
        """Which of `addrs` accept a new TCP connection from here, and which were refused as not the asker's."""
        if not isinstance(addrs, list):
            return [], []
        self.dial_backs += 1
        asker = self.host.remote_ip(peer)
        loop = asyncio.get_running_loop()

        refused: list[str] = []

        async def accepts(addr: str) -> bool:
            try:
                host, port, _ = parse_addr(addr)
                async with asyncio.timeout(DIAL_BACK_TIMEOUT):
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                    ips = [str(info[4][0]) for info in infos]
                    own = next((ip for ip in ips if asker is not None and owns_address(ip, asker)), None)
                    if own is None:
                        self.dial_back_refused += 1
                        refused.append(addr)
                        logger.info(
                            "refused to dial back an address that is not the asker's",
                            extra={"peer_id": peer, "addr": addr},
                        )
                        return False
                    _, writer = await asyncio.open_connection(own, port)  # the checked IP, not a re-resolve
            except (OSError, ValueError, TimeoutError):
                return False
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True

        candidates = [a for a in addrs[:8] if isinstance(a, str) and not is_circuit(a)]
        results = await asyncio.gather(*(accepts(a) for a in candidates))
        return [a for a, ok in zip(candidates, results, strict=True) if ok], refused

    async def _reserve(self, stream: Stream) -> None:
        peer = stream.remote_peer
        if not self.serve:
            await write_msg(stream, {"ok": False, "error": "this node is not a relay"})
        elif peer not in self.reservations and len(self.reservations) >= self.max_reservations:
            await write_msg(stream, {"ok": False, "error": "relay full"})
        else:
            self.reservations.add(peer)
            # The private peer is reachable only through this connection: the limits must not close it.
            self.host.connections.protect(peer, RELAY)
            logger.info("relay slot reserved", extra={"peer_id": peer})
            await write_msg(stream, {"ok": True, "ttl": 0})

    async def _connect(self, stream: Stream, target: Any) -> None:
        if not self.serve or not isinstance(target, str) or target not in self.reservations:
            await write_msg(stream, {"ok": False, "error": "no reservation for that peer"})
            return
        if self.circuits >= self.max_circuits:
            await write_msg(stream, {"ok": False, "error": "too many circuits"})
            return
        self.circuits += 1
        try:
            try:
                onward = await self.host.open_stream(target, PROTO_RELAY, timeout=5.0)
                await write_msg(onward, {"t": "incoming", "from": stream.remote_peer})
                reply = await read_msg(onward, 4096)
            except (OpenTelaError, asyncio.IncompleteReadError) as exc:
                await write_msg(stream, {"ok": False, "error": f"target unreachable: {exc}"})
                return
            if not isinstance(reply, dict) or not reply.get("ok"):
                await write_msg(stream, {"ok": False, "error": "target refused"})
                onward.reset(0, "refused")
                return
            await write_msg(stream, {"ok": True})
            await splice(stream, onward)
            with contextlib.suppress(OpenTelaError):
                await onward.aclose()
        finally:
            self.circuits -= 1
