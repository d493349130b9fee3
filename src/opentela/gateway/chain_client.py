"""The chain client: one generation session of a split model, driven from the ingress over a chain of block servers.

The ingress keeps, for every server on the chain, the inputs it sent that server at each step (PETALS' client-side
cache). When a server fails, the blocks it ran are given to a replacement sub-chain, which is brought up to date
by replaying those inputs in the same chunks as the first time (the prefill as one chunk, then one token per
step); the same shapes give bit-identical states, so the generation goes on with the tokens an undisturbed run
would have produced, and the user sees no error.

With server-to-server forwarding the ingress sends each step to the first server only and reads the result from
the last; it then keeps only the chain's own inputs, and a failure replays the whole session on a new chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from opentela._types import Stream
from opentela.errors import NoHealthyReplicaError, OpenTelaError, ProtocolError, UpstreamTimeout
from opentela.fabric.block_frames import Frame, encode_frame, read_frame, tensor_head
from opentela.registry.record import NodeRecord

logger = logging.getLogger(__name__)

OpenBlockStream = Callable[[NodeRecord, float], Awaitable[Stream]]
ChooseChain = Callable[[int, int, frozenset[str]], list[tuple[NodeRecord, int, int]]]
"""(first block, end block, excluded sessions) -> [(server record, first, end), ...] covering the range."""
Observe = Callable[[NodeRecord, float, float], None]
"""(server, round-trip seconds, compute seconds) after each answered step: the ingress learns its links' costs."""


class HopFailed(OpenTelaError):
    """A block server could not run its part of a step (gone, reset, refused, too slow)."""

    code = "block_server_failed"
    status = 502


@dataclass(eq=False)
class Hop:
    """One server of a chain and what the client keeps for it."""

    record: NodeRecord
    first: int
    end: int
    stream: Stream | None = None
    inputs: list[np.ndarray] = field(default_factory=list)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)

    def __repr__(self) -> str:
        return f"{self.record.peer_id[-6:]}[{self.first}:{self.end})"


class ChainSession:
    """Runs every block of a split model on each step, replacing failed servers as it goes."""

    def __init__(
        self,
        *,
        model: str,
        n_blocks: int,
        max_length: int,
        choose: ChooseChain,
        open_stream: OpenBlockStream,
        observe: Observe | None = None,
        server_forwarding: bool = False,
        connect_timeout: float = 10.0,
        step_timeout: float = 60.0,
        max_failovers: int = 3,
        request_id: str = "",
    ) -> None:
        self.model, self.n_blocks, self.max_length = model, n_blocks, max_length
        self._choose, self._open_stream, self._observe = choose, open_stream, observe
        self.server_forwarding = server_forwarding
        self.connect_timeout, self.step_timeout = connect_timeout, step_timeout
        self.max_failovers = max_failovers
        self.request_id = request_id or uuid.uuid4().hex
        self.hops: list[Hop] = []
        self.history: list[np.ndarray] = []
        """Every step's input to block 0 (what a server-to-server chain replays)."""
        self.failovers = 0
        self.chain_s = 0.0
        """Wall time spent in `step`, replays included."""
        self.compute_s = 0.0
        """Of which the servers reported computing; the rest is the fabric, serialization and waiting."""
        self.excluded: set[str] = set()
        self._opened = 0

    def __repr__(self) -> str:
        return f"<ChainSession {self.model} {self.describe()} failovers={self.failovers}>"

    def describe(self) -> str:
        """The chain as `peer[first:end)` hops, for headers and logs."""
        return ",".join(repr(h) for h in self.hops)

    # --- opening -----------------------------------------------------------------------------------------------
    async def open(self) -> None:
        """Pick a chain for all blocks and open a session on each of its servers."""
        self.hops = await self._open_chain(0, self.n_blocks)

    async def _open_chain(self, lo: int, hi: int) -> list[Hop]:
        while True:
            try:
                links = self._choose(lo, hi, frozenset(self.excluded))
            except LookupError as exc:
                raise NoHealthyReplicaError(
                    f"no chain of live block servers covers blocks {lo}-{hi} of {self.model}: {exc}",
                ) from None
            hops = [Hop(record, first, end) for record, first, end in links]
            try:
                await self._open_hops(hops)
                return hops
            except HopFailed as exc:
                failed = exc.details.get("session")
                await self._close_hops(hops)
                self._count_failover(f"opening: {exc}")
                if isinstance(failed, str):
                    self.excluded.add(failed)

    async def _open_hops(self, hops: list[Hop]) -> None:
        self._opened += 1
        session_id = f"{self.request_id}.{self._opened}"
        for index, hop in enumerate(hops):
            head: dict[str, object] = {
                "s": session_id,
                "m": self.model,
                "a": hop.first,
                "e": hop.end,
                "L": self.max_length,
                "r": self.request_id,
            }
            if self.server_forwarding:
                if index + 1 < len(hops):
                    nxt = hops[index + 1].record
                    head["x"] = {"p": nxt.peer_id, "a": list(nxt.addrs)}
                if index > 0:
                    head["p"] = hops[index - 1].record.peer_id
            try:
                async with asyncio.timeout(self.connect_timeout):
                    hop.stream = await self._open_stream(hop.record, self.connect_timeout)
                    hop.stream.on_abort(hop.aborted.set)
                    await hop.stream.write(encode_frame("open", head))
                    reply = await read_frame(hop.stream, 0)
            except (OpenTelaError, TimeoutError, OSError) as exc:
                raise HopFailed(
                    f"opening a session on {hop!r}: {exc!r}", session=hop.record.session_id
                ) from None
            if reply is None or reply.op != "ready":
                why = reply.head if reply is not None else "closed"
                raise HopFailed(f"{hop!r} refused the session: {why}", session=hop.record.session_id)

    # --- stepping ----------------------------------------------------------------------------------------------
    async def step(self, hidden: np.ndarray) -> np.ndarray:
        """Run `hidden` ([tokens, hidden size] float32) through every block; the last block's output."""
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        began = time.perf_counter()
        if self.server_forwarding:
            out = await self._step_forwarded(hidden)
        else:
            out = await self._run(self.hops, hidden)
        self.chain_s += time.perf_counter() - began
        self.history.append(hidden)
        return out

    async def _run(self, hops: list[Hop], hidden: np.ndarray) -> np.ndarray:
        """Client-centric: each hop in turn; a failed hop is replaced by a sub-chain that replays its inputs."""
        index = 0
        while index < len(hops):
            hop = hops[index]
            try:
                out = await self._call(hop, hidden)
            except HopFailed as exc:
                hops[index : index + 1] = await self._replace(hop, exc)
                continue
            hop.inputs.append(hidden)
            hidden = out
            index += 1
        return hidden

    async def _replace(self, failed: Hop, exc: HopFailed) -> list[Hop]:
        self._count_failover(str(exc))
        self.excluded.add(failed.record.session_id)
        await self._close_hops([failed])
        replacement = await self._open_chain(failed.first, failed.end)
        logger.warning(
            "block server failed; replaying its %d steps on %s",
            len(failed.inputs),
            ",".join(map(repr, replacement)),
            extra={"request_id": self.request_id, "failed": repr(failed), "why": str(exc)[:200]},
        )
        for past in failed.inputs:
            await self._run(replacement, past)
        return replacement

    async def _call(self, hop: Hop, hidden: np.ndarray) -> np.ndarray:
        assert hop.stream is not None
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.step_timeout):
                await hop.stream.write(encode_frame("step", tensor_head("f4", hidden.shape), hidden.data))
                return self._output(
                    hop, await read_frame(hop.stream, hidden.shape[0] * hidden.shape[1] * 4), began
                )
        except TimeoutError:
            raise HopFailed(
                f"{hop!r} took over {self.step_timeout:g} s", session=hop.record.session_id
            ) from None
        except (OpenTelaError, OSError) as exc:
            if isinstance(exc, HopFailed):
                raise
            raise HopFailed(f"{hop!r}: {exc!r}", session=hop.record.session_id) from None

    def _output(self, hop: Hop, frame: Frame | None, began: float) -> np.ndarray:
        if not isinstance(frame, Frame):
            raise HopFailed(f"{hop!r} closed the session", session=hop.record.session_id)
        if frame.op != "out":
            raise HopFailed(f"{hop!r} answered {frame.op}: {frame.head}", session=hop.record.session_id)
        try:
            shape = frame.shape(self.max_length * 65536)
        except ProtocolError as exc:
            raise HopFailed(f"{hop!r} sent a bad tensor: {exc}", session=hop.record.session_id) from None
        us = frame.head.get("us")
        compute = us / 1e6 if isinstance(us, int) else 0.0
        self.compute_s += compute
        if self._observe is not None:
            self._observe(hop.record, time.perf_counter() - began, compute)
        return np.frombuffer(frame.payload, dtype=np.float32).reshape(shape)

    # --- server-to-server forwarding ---------------------------------------------------------------------------
    async def _step_forwarded(self, hidden: np.ndarray) -> np.ndarray:
        while True:
            try:
                return await self._forward_once(hidden)
            except HopFailed as exc:
                self._count_failover(str(exc))
                broken = [h for h in self.hops if h.aborted.is_set()]
                culprit = exc.details.get("session")
                for hop in broken:
                    self.excluded.add(hop.record.session_id)
                if not broken and isinstance(culprit, str):
                    self.excluded.add(culprit)
                await self._close_hops(self.hops)
                self.hops = await self._open_chain(0, self.n_blocks)
                logger.warning(
                    "chain broke; replaying %d steps on %s",
                    len(self.history),
                    self.describe(),
                    extra={"request_id": self.request_id, "why": str(exc)[:200]},
                )
                for past in self.history:
                    await self._forward_once(past)

    async def _forward_once(self, hidden: np.ndarray) -> np.ndarray:
        first, last = self.hops[0], self.hops[-1]
        assert first.stream is not None and last.stream is not None
        began = time.perf_counter()
        try:
            await first.stream.write(encode_frame("step", tensor_head("f4", hidden.shape), hidden.data))
        except (OpenTelaError, OSError) as exc:
            raise HopFailed(f"{first!r}: {exc!r}", session=first.record.session_id) from None
        reader = asyncio.ensure_future(read_frame(last.stream, hidden.shape[0] * hidden.shape[1] * 4))
        watchers = [asyncio.ensure_future(h.aborted.wait()) for h in self.hops]
        try:
            done, _ = await asyncio.wait(
                [reader, *watchers], timeout=self.step_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in watchers:
                w.cancel()
        if reader not in done:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            broken = next((h for h in self.hops if h.aborted.is_set()), None)
            if broken is not None:
                raise HopFailed(f"{broken!r} went away", session=broken.record.session_id)
            raise HopFailed(f"the chain took over {self.step_timeout:g} s", session=last.record.session_id)
        try:
            frame = reader.result()
        except (OpenTelaError, OSError) as exc:
            raise HopFailed(f"{last!r}: {exc!r}", session=last.record.session_id) from None
        return self._output(last, frame, began)

    # --- closing -----------------------------------------------------------------------------------------------
    def _count_failover(self, why: str) -> None:
        self.failovers += 1
        if self.failovers > self.max_failovers:
            raise (
                UpstreamTimeout(f"the chain for {self.model} failed {self.failovers} times; last: {why}")
                if "took over" in why
                else NoHealthyReplicaError(
                    f"the chain for {self.model} failed {self.failovers} times; last: {why}"
                )
            )

    async def _close_hops(self, hops: list[Hop]) -> None:
        for hop in hops:
            if hop.stream is not None:
                with contextlib.suppress(OpenTelaError, OSError):
                    await hop.stream.aclose()
                hop.stream = None

    async def aclose(self) -> None:
        """End the session on every server (their caches are freed)."""
        await self._close_hops(self.hops)
