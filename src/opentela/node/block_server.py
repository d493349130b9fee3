"""A block server: decoder blocks [start, end) of a split model, served over /otela/blocks/1 with per-session caches.

Each session is one stream from its chain client (fabric/block_frames.py). The session's attention cache lives as
long as its stream does, within the server's cache budget; idle sessions past their TTL are the first to go when a
new one does not fit. The blocks run in one worker thread, one step at a time: NumPy does its own threading inside a
step, and one step at a time keeps every result bit-identical to the same step run anywhere else, which is what lets
a client replay a session on another server after a failure and get the same tokens.

With a next hop in its `open` frame, a server passes its output straight to the next server (server-to-server
forwarding); the last server of the chain answers the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opentela._types import PROTO_BLOCKS, PeerId, Stream
from opentela.errors import OpenTelaError, ProtocolError
from opentela.fabric.block_frames import (
    RESET_BAD_FRAME,
    RESET_SERVER_STOPPING,
    Frame,
    encode_frame,
    read_frame,
    tensor_head,
)
from opentela.model.blocks import BlockStack
from opentela.model.kv_cache import CacheFull, CacheStore, SessionCache
from opentela.registry.record import BlockSpan

logger = logging.getLogger(__name__)

OpenStream = Callable[[PeerId, tuple[str, ...], float], Awaitable[Stream]]
"""Opens a stream of the blocks protocol to a peer at some addresses, within a timeout."""

RELAY_DIAL_TIMEOUT = 10.0


@dataclass(eq=False)
class _Session:
    key: str
    client: Stream
    first: int
    end: int
    cache: SessionCache
    max_length: int
    next_hop: tuple[PeerId, tuple[str, ...]] | None = None
    prev_peer: PeerId | None = None
    relay: Stream | None = None
    steps: int = 0
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class BlockServer:
    """Serves one contiguous block range of one model to chain clients."""

    def __init__(
        self,
        model: str,
        model_file: str,
        start: int,
        end: int,
        *,
        cache_bytes: int,
        session_ttl_s: float,
        open_stream: OpenStream,
    ) -> None:
        self.model, self.model_file = model, model_file
        self.start, self.end = start, end
        self.cache_bytes, self.session_ttl_s = cache_bytes, session_ttl_s
        self._open_stream = open_stream
        self.stack: BlockStack | None = None
        self.store: CacheStore | None = None
        self.block_ms = 0.0
        self._sessions: dict[str, _Session] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="blocks")
        self._closing = False
        self.counters = {"sessions": 0, "steps": 0, "tokens": 0, "refused": 0, "relayed": 0, "compute_s": 0.0}

    def __repr__(self) -> str:
        return f"<BlockServer {self.model}[{self.start}:{self.end}) sessions={len(self._sessions)}>"

    # --- lifecycle ---------------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Read the blocks' weights and time one decode step (what the record advertises for routing)."""
        loop = asyncio.get_running_loop()
        self.stack = await loop.run_in_executor(
            self._pool, lambda: BlockStack(self.model_file, self.start, self.end)
        )
        if not 0 <= self.start < self.end <= self.stack.config.n_blocks:
            raise OpenTelaError(
                f"blocks {self.start}-{self.end} are outside {self.model}'s {self.stack.config.n_blocks} blocks"
            )
        self.store = CacheStore.for_stack(self.stack, self.cache_bytes, self.session_ttl_s)
        self.block_ms = await loop.run_in_executor(self._pool, self._time_decode_step)
        logger.info(
            "serving blocks %d-%d of %s: %.2f ms per block per token, %d MiB of cache",
            self.start,
            self.end,
            self.model,
            self.block_ms,
            self.cache_bytes >> 20,
        )

    def _time_decode_step(self) -> float:
        assert self.stack is not None
        stack = self.stack
        cache = SessionCache.for_stack(stack, 8)
        x = np.zeros((1, stack.config.hidden_size), dtype=np.float32)
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            stack.forward(x, cache)
            best = min(best, time.perf_counter() - began)
        return best * 1000 / (self.end - self.start)

    def span(self) -> BlockSpan:
        """What this server puts in its node's record."""
        assert self.stack is not None, "load() first"
        return BlockSpan(
            self.model,
            self.start,
            self.end,
            self.stack.config.n_blocks,
            self.cache_bytes,
            round(self.block_ms, 4),
        )

    async def aclose(self) -> None:
        """Refuse new sessions and end every open one."""
        self._closing = True
        for session in list(self._sessions.values()):
            session.client.reset(RESET_SERVER_STOPPING, "block server stopping")
            if session.relay is not None:
                session.relay.reset(RESET_SERVER_STOPPING, "block server stopping")
        self._sessions.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        """Counters and cache use, for /v1/dnt/stats."""
        store = self.store
        return {
            "model": self.model,
            "blocks": [self.start, self.end],
            "sessions": len(self._sessions),
            "cache": store.stats() if store is not None else {},
            **self.counters,
        }

    # --- the protocol ------------------------------------------------------------------------------------------
    async def handle_stream(self, stream: Stream) -> None:
        """Serve one stream: a client's session (`open` first) or a previous server's relay (`relay` first)."""
        try:
            first = await read_frame(stream, 0)
            if first is None:
                return
            if first.op == "open":
                await self._serve_session(stream, first)
            elif first.op == "relay":
                await self._serve_relay(stream, first)
            else:
                raise ProtocolError(f"a blocks stream must start with open or relay, not {first.op!r}")
        except ProtocolError as exc:
            logger.info("blocks stream from %s refused: %s", stream.remote_peer, exc)
            stream.reset(RESET_BAD_FRAME, str(exc)[:200])
        except OpenTelaError as exc:
            # The stream went away under us (the client left, or a relay broke): its session is over.
            logger.debug("blocks stream from %s ended: %s", stream.remote_peer, exc)

    def _max_payload(self) -> int:
        assert self.stack is not None
        cfg = self.stack.config
        return cfg.context_length * cfg.hidden_size * 4

    async def _serve_session(self, stream: Stream, frame: Frame) -> None:
        session = await self._open(stream, frame)
        if session is None:
            return
        try:
            while (step := await read_frame(stream, self._max_payload())) is not None:
                if step.op != "step":
                    raise ProtocolError(f"unexpected {step.op!r} frame in a session")
                await self._step(session, step)
            await stream.write_eof()
        finally:
            self._end(session)

    async def _open(self, stream: Stream, frame: Frame) -> _Session | None:
        assert self.stack is not None and self.store is not None
        head = frame.head
        session_id, model = head.get("s"), head.get("m")
        first, end, max_length = head.get("a"), head.get("e"), head.get("L")
        if not (isinstance(session_id, str) and 0 < len(session_id) <= 128 and isinstance(model, str)):
            raise ProtocolError("open needs a session id and a model")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (first, end, max_length)):
            raise ProtocolError("open needs integer a, e and L")
        assert isinstance(first, int) and isinstance(end, int) and isinstance(max_length, int)
        error = None
        if self._closing:
            error = ("server_stopping", "this block server is stopping")
        elif model != self.model:
            error = ("wrong_model", f"this server holds {self.model}, not {model}")
        elif not self.start <= first < end <= self.end:
            error = ("wrong_blocks", f"blocks {first}-{end} are not within {self.start}-{self.end}")
        elif not 0 < max_length <= self.stack.config.context_length:
            error = ("bad_length", f"L must be in 1..{self.stack.config.context_length}")
        key = f"{stream.remote_peer}/{session_id}"
        if error is None and key in self._sessions:
            error = ("duplicate_session", f"session {session_id} is already open here")
        cache = None
        if error is None:
            try:
                cache = self.store.open(key, max_length, n_blocks=end - first, now=time.monotonic())
            except CacheFull as exc:
                error = ("cache_full", str(exc))
        if error is not None or cache is None:
            code, message = error or ("cache_full", "no cache")
            self.counters["refused"] += 1
            await stream.write(encode_frame("error", {"code": code, "message": message}))
            await stream.write_eof()
            return None
        next_hop = _next_hop(head.get("x"))
        prev = head.get("p")
        session = _Session(
            key, stream, first, end, cache, max_length, next_hop, prev if isinstance(prev, str) else None
        )
        self._sessions[key] = session
        self.counters["sessions"] += 1
        await stream.write(
            encode_frame(
                "ready",
                {
                    "a": first,
                    "e": end,
                    "c": cache.nbytes,
                    "f": self.store.capacity_bytes - self.store.reserved_bytes,
                },
            )
        )
        return session

    def _end(self, session: _Session) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        if self.store is not None:
            self.store.close(session.key)
        if session.relay is not None:
            asyncio.get_running_loop().create_task(session.relay.aclose())

    async def _serve_relay(self, stream: Stream, frame: Frame) -> None:
        """Steps of a session passed on by the server before us on its chain."""
        session_id, client = frame.head.get("s"), frame.head.get("c")
        session = self._sessions.get(f"{client}/{session_id}")
        if session is None or session.prev_peer != stream.remote_peer:
            raise ProtocolError("relay for a session this server does not hold from that peer")
        while (step := await read_frame(stream, self._max_payload())) is not None:
            if step.op != "step":
                raise ProtocolError(f"unexpected {step.op!r} frame on a relay")
            if self._sessions.get(session.key) is not session:
                stream.reset(RESET_SERVER_STOPPING, "session ended")
                return
            await self._step(session, step)

    async def _step(self, session: _Session, frame: Frame) -> None:
        assert self.stack is not None and self.store is not None
        hidden_size = self.stack.config.hidden_size
        shape = frame.shape(session.max_length * hidden_size)
        if len(shape) != 2 or shape[1] != hidden_size or frame.head["d"] != "f4":
            raise ProtocolError(f"a step carries float32 [tokens, {hidden_size}], not {shape}")
        if session.cache.length + shape[0] > session.max_length:
            await self._send_error(
                session, "context_full", f"session is over its {session.max_length} tokens"
            )
            raise ProtocolError("session over its length")
        x = np.frombuffer(frame.payload, dtype=np.float32).reshape(shape)
        began = time.perf_counter()
        out = await asyncio.get_running_loop().run_in_executor(
            self._pool, self.stack.forward, x, session.cache, session.first, session.end
        )
        elapsed = time.perf_counter() - began
        self.store.touch(session.key, time.monotonic())
        session.steps += 1
        self.counters["steps"] += 1
        self.counters["tokens"] += shape[0]
        self.counters["compute_s"] += elapsed
        step_index = frame.head.get("i", session.steps)
        payload = np.ascontiguousarray(out, dtype=np.float32).data
        if session.next_hop is not None:
            await self._relay(session, step_index, out.shape, payload)
            return
        async with session.write_lock:
            await session.client.write(
                encode_frame(
                    "out", tensor_head("f4", out.shape, i=step_index, us=int(elapsed * 1e6)), payload
                )
            )

    async def _relay(self, session: _Session, step_index: Any, shape: tuple[int, ...], payload: Any) -> None:
        assert session.next_hop is not None
        if session.relay is None:
            peer, addrs = session.next_hop
            session.relay = await self._open_stream(peer, addrs, RELAY_DIAL_TIMEOUT)
            client, sid = session.key.split("/", 1)
            await session.relay.write(encode_frame("relay", {"s": sid, "c": client}))
        self.counters["relayed"] += 1
        await session.relay.write(encode_frame("step", tensor_head("f4", shape, i=step_index), payload))

    async def _send_error(self, session: _Session, code: str, message: str) -> None:
        async with session.write_lock:
            await session.client.write(encode_frame("error", {"code": code, "message": message}))


def _next_hop(raw: Any) -> tuple[PeerId, tuple[str, ...]] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("p"), str):
        raise ProtocolError("a next hop names a peer (p) and its addresses (a)")
    addrs = raw.get("a", [])
    if not isinstance(addrs, list) or len(addrs) > 16 or not all(isinstance(a, str) for a in addrs):
        raise ProtocolError("a next hop's addresses must be a short list of strings")
    return raw["p"], tuple(addrs)


__all__ = ["PROTO_BLOCKS", "BlockServer"]
