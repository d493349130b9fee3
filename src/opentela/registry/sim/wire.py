"""What every simulated message weighs on the wire, measured once from the real encoders.

Each size is the real thing: `encode_msg` (u32 length and msgpack) of the messages `membership.py` and `gossip.py`
build, signed `NodeRecord`s from `record.py`, the mux frames of `fabric/_frames.py` (12-byte header, the protocol
name on a stream's SYN, FIN riding on the last frame, the CANCEL reset a side sends when it closes a stream the
peer has not finished), and TLS 1.3: the per-record overhead and the handshake bytes, taken from two real
`TlsSession`s shaking hands in memory, plus the identity handshake of `fabric/handshake.py`.

Who sends what in one exchange follows the stream code (a flight is what one side writes in one event-loop pass,
one TLS record per 16 KiB of it):

  probe      I: SYN+ping                  R: ack+FIN, RST(cancel)
  ping-req   as a probe, the helper's own probe of the target in between
  push       I: SYN+push+FIN, then RST(cancel) in the next pass         R: FIN (its handler ends first)
  ids, prune as a push, the message carrying ids ("i") or the prune flag ("x") instead of records
  graft      I: SYN+graft                 R: recs*, end+FIN, RST(cancel)
  sum        I: SYN+sum                   R: same+FIN, RST(cancel)     (equal digests: the idle case)
  exchange   I: SYN+sum   R: digest   I: want, recs*, end   R: recs*, end+FIN, RST(cancel)
  by shards  I: SYN+sum   R: sums   I: shards   R: digest (of those classes), then as an exchange
  keepalive  PING then PING|ACK, each alone in a TLS record, on a connection silent for keepalive_interval

`benchmarks/scale.py` checks these against the bytes real hosts write on loopback sockets.
"""

from __future__ import annotations

import functools
import math
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from opentela._types import PROTO_GOSSIP, PROTO_PROBE, PROTO_VIEW, Lifecycle
from opentela.fabric import _frames as fr
from opentela.fabric.handshake import encode_client_hello, encode_server_hello, encode_verdict
from opentela.fabric.identity import Identity
from opentela.fabric.messages import encode_msg
from opentela.fabric.tls import TlsMaterial, TlsSession
from opentela.registry.record import ModelEntry, NodeRecord

TLS_MAX_PLAINTEXT = 16384
FRAME_PAYLOAD = 64 * 1024  # FabricConfig.max_frame_payload: larger writes go out as several frames
CANCEL_REASON = "stream closed before the end of its data"  # MuxStream.aclose's reset message
MAX_UPDATES = 16

EXAMPLE_HARDWARE: dict[str, Any] = {
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "uuid": "GPU-3f2a9c1e-5b7d-4e8a-9c0f-1d2e3f4a5b6c",
        }
    ],
    "gpu_source": "nvml",
    "cpu": {
        "model": "AMD EPYC 9454 48-Core Processor",
        "arch": "x86_64",
        "cores": 48,
        "threads": 96,
        "usable": 96,
        "flags": ["avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "fma", "f16c"],
    },
    "ram_mib": 773400,
    "os": "Linux 5.15.0-119-generic",
    "hostname": "gpu-worker-0042",
}
"""A representative one-GPU worker's hardware probe (the scale runs' records; validation uses this machine's)."""

EXAMPLE_MODEL = ModelEntry("meta-llama/Llama-3.1-8B-Instruct", "vllm", {"max_model_len": 32768})


def array_header(n: int) -> int:
    """Bytes of a msgpack array (or map) header for n elements."""
    return 1 if n < 16 else 3 if n < 65536 else 5


@dataclass(frozen=True)
class WireSizes:
    """Message and protocol overheads in bytes; `measure()` builds them from the real code."""

    tls_overhead: int
    """TLS 1.3 record header, content type and AEAD tag added to each record."""
    handshake_dialer: int
    """TLS handshake and identity handshake bytes the dialing side sends."""
    handshake_listener: int
    record: tuple[int, int, int, int]
    """msgpack bytes of one signed record by lifecycle: JOIN, SERVING, DOWN, LEFT (a tombstone)."""
    ping: tuple[int, ...]
    """encode_msg bytes of a ping carrying k piggybacked updates (index k)."""
    ack: tuple[int, ...]
    ping_req: tuple[int, ...]
    not_that: int
    nack: int
    gossip_sum: int
    gossip_same: int
    gossip_end: int
    digest_base: int
    """A digest message without its entries (the map header counted separately)."""
    digest_entry: int
    want_base: int
    want_entry: int
    records_base: int
    """A `recs` or `push` message without its records (the array header counted separately)."""
    have_base: int
    """A push message carrying ids (lazy push), without its entries (the array header counted separately)."""
    have_entry: int
    """One id: [session, lifecycle, version]."""
    prune: int
    """encode_msg bytes of a prune (a push message with "x": 1)."""
    graft_base: int
    graft_entry: int
    sums_base: int
    """A "sums" message (class hashes) without its entries (the array header counted separately)."""
    sums_entry: int
    shards_base: int
    """A "shards" message without its entries; each class index is 1 byte below 128, 2 below 256."""
    syn_probe: int
    syn_gossip: int
    syn_view: int
    view_ok: int
    example_peer: str
    """A real peer id: overlay messages name peers."""
    example_addrs: tuple[str, ...]
    """A record's addresses: overlay messages carry them."""
    rst_cancel: int
    goaway: int
    keepalive: int
    """One keepalive PING (or its answer) in its own TLS record."""

    # --- measurement --------------------------------------------------------------------------------------
    @classmethod
    def measure(cls, hardware: Mapping[str, Any] | None = None, model: ModelEntry | None = None) -> WireSizes:
        """Encode real records and messages, shake hands between two real TLS sessions, and count."""
        identity = Identity.generate()
        session = uuid.uuid4().hex
        join = NodeRecord(
            session_id=session,
            peer_id=identity.peer_id,
            provider_id="operator@gpu-worker-0042",
            lifecycle=Lifecycle.JOIN,
            version=1,
            addrs=("203.0.113.42:7077", f"/ip4/203.0.113.42/tcp/7077/p2p/{identity.peer_id}"),
            roles=("worker",),
            hardware=dict(EXAMPLE_HARDWARE if hardware is None else hardware),
            started_at=1.79e9,
            updated_at=1.79e9,
        ).signed(identity)
        serving = join.next(identity, lifecycle=Lifecycle.SERVING, models=(model or EXAMPLE_MODEL,))
        down = serving.next(identity, lifecycle=Lifecycle.DOWN)
        left = serving.tombstone(version=serving.version + 1, reason="no answer to any probe for 10 s (SWIM)")
        records = tuple(_packed(r.to_wire()) for r in (join, serving, down, left.signed(identity)))
        update = [1, session, 0]
        peer = identity.peer_id

        def with_updates(base: dict[str, Any]) -> tuple[int, ...]:
            return tuple(
                len(encode_msg({**base, "u": [update] * k} if k else base)) for k in range(MAX_UPDATES + 1)
            )

        digest1 = len(encode_msg({"t": "digest", "d": {session: [1, 1]}, "l": 1}))
        have1 = len(encode_msg({"t": "push", "i": [[session, 1, 2]]}))
        graft1 = len(encode_msg({"t": "graft", "k": [session]}))
        sums1 = len(encode_msg({"t": "sums", "k": 200, "h": [os.urandom(8)], "l": 1}))
        want1 = len(encode_msg({"t": "want", "k": [session]}))
        recs0 = len(encode_msg({"t": "recs", "r": []}))
        tls_overhead, dialer, listener = _tls_costs()
        return cls(
            tls_overhead=tls_overhead,
            handshake_dialer=dialer,
            handshake_listener=listener,
            record=records,  # type: ignore[arg-type]  # four lifecycles, by construction
            ping=with_updates({"p": session}),
            ack=with_updates({"a": 0}),
            ping_req=with_updates({"r": session, "w": peer}),
            not_that=len(encode_msg({"x": 1})),
            nack=len(encode_msg({"f": 1})),
            gossip_sum=len(encode_msg({"t": "sum", "h": os.urandom(16), "l": 1})),
            gossip_same=len(encode_msg({"t": "same", "l": 1})),
            gossip_end=len(encode_msg({"t": "end"})),
            digest_base=digest1 - _packed({session: [1, 1]}),
            digest_entry=_packed(session) + _packed([1, 1]),
            want_base=want1 - _packed([session]),
            want_entry=_packed(session),
            records_base=recs0 - 1,
            have_base=have1 - _packed([[session, 1, 2]]),
            have_entry=_packed([session, 1, 2]),
            prune=len(encode_msg({"t": "push", "x": 1})),
            graft_base=graft1 - _packed([session]),
            graft_entry=_packed(session),
            sums_base=sums1 - _packed([os.urandom(8)]),
            sums_entry=_packed(os.urandom(8)),
            shards_base=len(encode_msg({"t": "shards", "s": []})) - 1,
            syn_probe=fr.HEADER_SIZE + len(fr.syn_prefix(PROTO_PROBE)),
            syn_gossip=fr.HEADER_SIZE + len(fr.syn_prefix(PROTO_GOSSIP)),
            syn_view=fr.HEADER_SIZE + len(fr.syn_prefix(PROTO_VIEW)),
            view_ok=len(encode_msg({"ok": 1})),
            example_peer=peer,
            example_addrs=join.addrs,
            rst_cancel=len(fr.encode_rst(1, fr.ErrorCode.CANCEL, CANCEL_REASON)),
            goaway=len(fr.encode_goaway(fr.ErrorCode.NO_ERROR, "connection closed: idle")),
            keepalive=len(fr.encode_ping(1)) + tls_overhead,
        )

    # --- composition ------------------------------------------------------------------------------------
    def flight(self, plaintext: int) -> int:
        """Bytes on the wire for `plaintext` bytes of frames written in one pass."""
        return plaintext + self.tls_overhead * max(1, math.ceil(plaintext / TLS_MAX_PLAINTEXT))

    @staticmethod
    def framed(message: int) -> int:
        """A message written with one `stream.write`: its frames' headers and payload."""
        return message + fr.HEADER_SIZE * max(1, math.ceil(message / FRAME_PAYLOAD))

    def probe(self, ping: int, answer: int) -> tuple[int, int]:
        """(initiator, responder) bytes of one probe stream: a ping (or ping-req) and its answer."""
        return self.flight(self.syn_probe + ping), self.flight(fr.HEADER_SIZE + answer + self.rst_cancel)

    def push(self, record_bytes: int, count: int, step: int, ids: int = 0) -> tuple[int, int]:
        """(pusher, receiver) bytes of a push of `count` records of `record_bytes` in all (chunks of `step`),
        and of `ids` ids of records not sent (lazy push: a message of its own after the records)."""
        body = self.records_message(record_bytes, count, step)
        if ids:
            body += self.framed(self.have_base + array_header(ids) + ids * self.have_entry)
        pusher = self.flight(self.syn_gossip - fr.HEADER_SIZE + body) + self.flight(self.rst_cancel)
        return pusher, self.flight(fr.HEADER_SIZE)

    def prune_stream(self) -> tuple[int, int]:
        """(pruner, receiver) bytes of a push stream carrying a prune."""
        return self.flight(self.syn_gossip + self.prune) + self.flight(self.rst_cancel), self.flight(
            fr.HEADER_SIZE
        )

    def graft(self, keys: int) -> int:
        """Bytes of a graft request for `keys` records (the first flight of its stream)."""
        return self.flight(self.syn_gossip + self.graft_base + array_header(keys) + keys * self.graft_entry)

    def records_message(self, record_bytes: int, count: int, step: int) -> int:
        """Framed `recs`/`push` messages carrying `count` records of `record_bytes` in all."""
        if count <= 0:
            return 0
        chunks = math.ceil(count / step)
        headers = sum(array_header(min(step, count - i * step)) for i in range(chunks))
        return record_bytes + chunks * self.records_base + headers + chunks * fr.HEADER_SIZE

    def same(self) -> tuple[int, int]:
        """(initiator, responder) bytes of an anti-entropy round that found equal digests."""
        return self.probe_like(self.syn_gossip + self.gossip_sum, self.gossip_same)

    def probe_like(self, first: int, answer: int) -> tuple[int, int]:
        """A one-message request and a one-message answer that closes the stream with a reset."""
        return self.flight(first), self.flight(fr.HEADER_SIZE + answer + self.rst_cancel)

    def digest(self, entries: int) -> int:
        """encode_msg bytes of a digest of `entries` sessions."""
        return self.digest_base + array_header(entries) + entries * self.digest_entry

    def sums(self, classes: int) -> int:
        """encode_msg bytes of a "sums" message of `classes` class hashes."""
        return self.sums_base + array_header(classes) + classes * self.sums_entry

    def shards(self, asked: list[int]) -> int:
        """encode_msg bytes of a "shards" message asking for the given classes."""
        return self.shards_base + array_header(len(asked)) + sum(1 if c < 128 else 2 for c in asked)

    def want(self, keys: int) -> int:
        """encode_msg bytes of a want list of `keys` sessions."""
        return self.want_base + array_header(keys) + keys * self.want_entry


def _packed(obj: Any) -> int:
    return len(msgpack.packb(obj, use_bin_type=True))


def _tls_costs() -> tuple[int, int, int]:
    """(per-record overhead, dialer bytes, listener bytes) of TLS 1.3 plus the identity handshake."""
    server_id, client_id = Identity.generate(), Identity.generate()
    server_tls, client_tls = TlsMaterial.create(server_id), TlsMaterial.create(client_id)
    server = TlsSession(server_tls.server_context, server_side=True)
    client = TlsSession(client_tls.client_context, server_side=False)
    sent = {"client": 0, "server": 0}
    data = client.start()
    while data:
        sent["client"] += len(data)
        server.receive(data)
        reply = server.outgoing()
        sent["server"] += len(reply)
        if not reply:
            break
        client.receive(reply)
        data = client.outgoing()
    if not (client.handshake_done and server.handshake_done):
        raise RuntimeError("the in-memory TLS handshake did not complete")
    nonce = os.urandom(32)
    for side, session, message in (
        ("server", server, encode_server_hello(nonce)),
        ("client", client, encode_client_hello(client_id, server_tls.certificate, nonce)),
        ("server", server, encode_verdict(0)),
    ):
        session.encrypt(message)
        sent[side] += len(session.outgoing())
    client.encrypt(b"x" * 100)
    overhead = len(client.outgoing()) - 100
    return overhead, sent["client"], sent["server"]


@functools.lru_cache(maxsize=4096)
def view_message(
    peer_id: str, addrs: tuple[str, ...], kind: str, peer: bool, ttl: int, high: bool, sample: int
) -> int:
    """msgpack bytes of one overlay message as `Overlay._encode` writes it (addresses of its peer included)."""
    out: dict[str, Any] = {"t": kind}
    if kind == "join":
        out["a"] = list(addrs)
    if peer:
        out["p"] = peer_id
        out["a"] = list(addrs)
    if ttl:
        out["ttl"] = ttl
    if high:
        out["hi"] = 1
    if sample:
        out["s"] = [peer_id] * sample
    return _packed(out)


def view_batch(messages: list[int]) -> int:
    """encode_msg bytes of an overlay batch {"m": [...]} holding messages of the given sizes."""
    return 4 + 1 + _packed("m") + array_header(len(messages)) + sum(messages)
