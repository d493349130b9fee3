"""One rank of a tensor-parallel replica: a process holding some units of every block and their caches.

The rank connects to its replica's coordinator over a local socket and answers one message at a time, in order:
load or drop units, open and close a request's caches, compute a block's attention or FFN partials for a batch of
requests, roll caches back, restore caches from the coordinator's host backup. It keeps no state the coordinator
cannot rebuild: killing it loses its units and caches, which the survivors reload and restore.

Run by the replica as ``python -m opentela.engines.tp.worker --address PATH --rank N --model PATH``, with the
connection's key in ``OTELA_TP_AUTHKEY``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from typing import Any

import numpy as np

from opentela.model.kv_cache import SessionCache
from opentela.model.tensor_parallel import DEFAULT_FFN_SHARDS, ShardedBlocks
from opentela.model.threads import DEFAULT_THREADS, set_blas_threads

AUTHKEY_ENV = "OTELA_TP_AUTHKEY"


class RankWorker:
    """A rank's units and its requests' per-head caches, driven by the coordinator's messages."""

    def __init__(self, blocks: ShardedBlocks) -> None:
        self.blocks = blocks
        self.caches: dict[tuple[str, int], SessionCache] = {}
        self.max_length: dict[str, int] = {}

    def handle(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """Answer one coordinator message; an error comes back as ``("error", text)``."""
        op, *args = message
        began = time.perf_counter()
        try:
            result = getattr(self, "op_" + op)(*args)
        except Exception as exc:  # the coordinator reports it; the rank stays up for the next message
            return ("error", f"{type(exc).__name__}: {exc}")
        return ("ok", result, time.perf_counter() - began)

    # --- units and caches --------------------------------------------------------------------------------------
    def op_load(self, heads: Sequence[int], shards: Sequence[int]) -> dict[str, Any]:
        """Hold exactly these units: load the missing ones, drop the others."""
        blocks = self.blocks
        blocks.drop(set(blocks.heads) - set(heads), set(blocks.shards) - set(shards))
        began = time.perf_counter()
        loaded = blocks.load(heads, shards)
        return {"bytes": loaded, "seconds": time.perf_counter() - began, "held": blocks.weight_bytes}

    def op_open(self, request: str, max_length: int, heads: Sequence[int]) -> None:
        """Fresh empty caches for a request's heads on this rank."""
        self.max_length[request] = max_length
        for h in heads:
            self.caches[(request, h)] = self.blocks.new_head_cache(max_length)

    def op_close(self, request: str) -> None:
        """Free a request's caches."""
        self.max_length.pop(request, None)
        for key in [k for k in self.caches if k[0] == request]:
            self.caches.pop(key).release()

    def op_rollback(self, lengths: dict[str, int]) -> None:
        """Forget cache entries past each request's committed length (a step that did not finish everywhere)."""
        for (request, _), cache in self.caches.items():
            n = lengths.get(request)
            if n is not None and cache.length > n:
                cache.truncate(n)

    def op_restore(
        self,
        request: str,
        head: int,
        length: int,
        layers: Sequence[int],
        keys: np.ndarray,
        values: np.ndarray,
    ) -> int:
        """Write a head's cache of `layers` (from the host backup), ``[len(layers), length, head_dim]``."""
        cache = self.caches.get((request, head))
        if cache is None:
            cache = self.caches[(request, head)] = self.blocks.new_head_cache(self.max_length[request])
            cache.length = length
        if cache.length != length:
            raise ValueError(f"{request} head {head} holds {cache.length} tokens, the backup {length}")
        for j, layer in enumerate(layers):
            cache.keys[layer][0, :length] = keys[j]
            cache.values[layer][0, :length] = values[j]
        return int(keys.nbytes + values.nbytes)

    # --- compute -----------------------------------------------------------------------------------------------
    def op_attn(
        self, layer: int, items: Sequence[tuple[str, np.ndarray, Sequence[int]]]
    ) -> list[list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]]:
        """Per request, each of its heads' (head, partial, new K, new V) in block `layer`."""
        blocks, out = self.blocks, []
        for request, x, heads in items:
            normed = blocks.attention_input(layer, x)
            out.append(
                [(h, *blocks.head_partial(layer, normed, h, self.caches[(request, h)])) for h in heads]
            )
        return out

    def op_ffn(self, layer: int, items: Sequence[tuple[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """Per request, the partials of this rank's FFN shards (in shard order) in block `layer`; after the last
        block, the requests' caches count the step's tokens."""
        blocks, out = self.blocks, []
        shards = sorted(blocks.shards)
        for _, x in items:
            normed = blocks.ffn_input(layer, x)
            out.append([blocks.shard_partial(layer, normed, s) for s in shards])
        if layer == blocks.config.n_blocks - 1:
            for request, x in items:
                for (r, _), cache in self.caches.items():
                    if r == request:
                        cache.advance(x.shape[0])
        return out

    def op_ping(self) -> int:
        """Alive: answers with the process id."""
        return os.getpid()


def serve(conn: Connection, worker: RankWorker) -> None:
    """Answer messages until the coordinator says stop or goes away."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        conn.send(worker.handle(message))


def main(argv: Sequence[str] | None = None) -> None:
    """Connect to the coordinator, say hello, load nothing until told, and serve."""
    parser = argparse.ArgumentParser(prog="opentela.engines.tp.worker")
    parser.add_argument("--address", required=True, help="the coordinator's Unix socket")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--ffn-shards", type=int, default=DEFAULT_FFN_SHARDS)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    # The coordinator stops its ranks; a terminal's Ctrl-C reaches the whole group and is the coordinator's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_blas_threads(args.threads)
    authkey = bytes.fromhex(os.environ.get(AUTHKEY_ENV, ""))
    conn = Client(args.address, family="AF_UNIX", authkey=authkey)
    try:
        conn.send(("hello", args.rank, os.getpid()))
        # The coordinator has parsed the file: its config and tensor offsets spare this rank the seconds it takes.
        op, config, index = conn.recv()
        if op != "init":
            raise RuntimeError(f"expected the coordinator's init, got {op!r}")
        blocks = ShardedBlocks(args.model, args.ffn_shards, config=config, index=index)
        conn.send(("ok", None, 0.0))
        serve(conn, RankWorker(blocks))
    finally:
        conn.close()


if __name__ == "__main__":
    main()
