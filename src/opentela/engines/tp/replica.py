"""A tensor-parallel replica's coordinator: its ranks, its requests, each step's reductions, and its recovery.

The coordinator owns the embedding side of the replica's state: each request's committed length, the hidden
states of every step it was given (to re-prefill, if asked to recompute) and a host-memory backup of every KV head's
cache, written incrementally from the K and V each rank returns with its attention partials. A block runs as two
rounds: every rank gets the batch's block input, returns its units' partials, and the coordinator adds them in unit
order (`reduce_partials`) to the residual: a reduce to the coordinator and a broadcast of the next input, which is
an all-reduce over local sockets with the sum done once, in a fixed order.

When a rank dies (its socket closes, or it does not answer within `step_timeout`), the step in flight is undone on
the survivors, the placement moves to them keeping what each holds (`Placement.without`), each loads only the units
it lacks, and the caches whose owner changed are restored from the backup (or re-prefilled, with
``recovery="recompute"``). The step then runs again on the new placement: the requests go on with the tokens an
undisturbed run would have produced.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any, Literal

import numpy as np

from opentela.engines.tp.placement import Placement
from opentela.engines.tp.worker import AUTHKEY_ENV
from opentela.errors import EngineError, EngineUnavailableError
from opentela.model.config import ModelConfig
from opentela.model.tensor_parallel import DEFAULT_FFN_SHARDS, reduce_partials
from opentela.model.threads import DEFAULT_THREADS
from opentela.model.weights import GGUFWeights

logger = logging.getLogger(__name__)

Recovery = Literal["backup", "recompute"]
WeightReload = Literal["on_demand", "reshard"]
ReplicaState = Literal["starting", "serving", "reconfiguring", "failed"]


class RankLost(Exception):
    """A rank stopped answering: its process died, its socket closed, or it timed out."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"rank {rank} lost: {reason}")
        self.rank, self.reason = rank, reason


class RankError(EngineError):
    """A rank answered a message with an error (a bug or bad input, not a failure of the rank)."""

    code = "rank_error"


@dataclass
class RequestState:
    """One request's place in the replica."""

    id: str
    base: int
    """Its base rank position: replicated heads of block i go to rank ``(base + i) mod degree``."""
    max_length: int
    length: int = 0
    """Tokens every rank's caches hold (committed steps)."""
    keys: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, np.float32))
    values: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, np.float32))
    """The host backup, ``[n_kv, n_blocks, max_length, head_dim]``: valid up to `length`."""
    inputs: list[np.ndarray] = field(default_factory=list, repr=False)
    """Each committed step's hidden states, for a re-prefill."""


@dataclass
class RecoveryReport:
    """What one reconfiguration did and how long each part took (seconds)."""

    lost_rank: int
    reason: str
    degree_before: int
    degree_after: int
    mode: Recovery
    weight_reload: WeightReload
    requests: int
    weight_bytes: int = 0
    kv_bytes: int = 0
    kv_tokens: int = 0
    rollback_s: float = 0.0
    weights_s: float = 0.0
    kv_s: float = 0.0
    total_s: float = 0.0
    placement: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dict(self.__dict__)


@dataclass
class _Rank:
    id: int
    process: subprocess.Popen[bytes]
    conn: Connection


class TensorParallelReplica:
    """A model over `ranks` local worker processes, driven step by step from one thread at a time.

    Not thread-safe: the server calls it from one executor thread. `state`, `placement` and `recoveries` may be
    read from anywhere.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        ranks: int = 3,
        *,
        n_ffn_shards: int = DEFAULT_FFN_SHARDS,
        threads: int = DEFAULT_THREADS,
        recovery: Recovery = "backup",
        weights: WeightReload = "on_demand",
        step_timeout: float = 60.0,
        start_timeout: float = 120.0,
        log_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if ranks < 1:
            raise ValueError("a replica needs at least one rank")
        if weights not in ("on_demand", "reshard"):
            raise ValueError(f"weights must be 'on_demand' or 'reshard', not {weights!r}")
        self.weight_reload = weights
        if recovery not in ("backup", "recompute"):
            raise ValueError(f"recovery must be 'backup' or 'recompute', not {recovery!r}")
        self.model_path = str(model_path)
        self.config = ModelConfig.from_gguf(model_path)
        self.n_ranks, self.n_ffn_shards, self.threads = ranks, n_ffn_shards, threads
        self.recovery, self.step_timeout, self.start_timeout = recovery, step_timeout, start_timeout
        self.log_dir = Path(log_dir) if log_dir else None
        self.state: ReplicaState = "starting"
        self.placement: Placement | None = None
        self.recoveries: list[RecoveryReport] = []
        self.requests: dict[str, RequestState] = {}
        self._ranks: dict[int, _Rank] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="otela-tp-")
        self._lock = threading.Lock()
        self._restore_everything = False

    def __repr__(self) -> str:
        return f"<TensorParallelReplica {self.config.name} {self.state} ranks={self.healthy_ranks}>"

    @property
    def healthy_ranks(self) -> tuple[int, ...]:
        """Worker ids serving now."""
        return self.placement.ranks if self.placement else ()

    def rank_pids(self) -> dict[int, int]:
        """Worker id -> process id, for operators (and failure tests)."""
        return {r.id: r.process.pid for r in self._ranks.values()}

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the ranks, wait for each to connect, and load RaidServe's placement on them."""
        authkey = secrets.token_bytes(16)
        address = str(Path(self._tmp.name) / "coordinator.sock")
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        env = {**os.environ, AUTHKEY_ENV: authkey.hex()}
        processes = {}
        for rank in range(self.n_ranks):
            argv = [
                sys.executable,
                "-m",
                "opentela.engines.tp.worker",
                "--address",
                address,
                "--rank",
                str(rank),
                "--model",
                self.model_path,
                "--ffn-shards",
                str(self.n_ffn_shards),
                "--threads",
                str(self.threads),
            ]
            out = open(self.log_dir / f"rank{rank}.log", "ab") if self.log_dir else subprocess.DEVNULL
            processes[rank] = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            conns = self._accept(listener, processes)
        finally:
            listener.close()
        self._ranks = {r: _Rank(r, processes[r], conns[r]) for r in sorted(conns)}
        index = GGUFWeights(self.model_path).tensor_index()
        self._all({r: ("init", self.config, index) for r in self._ranks}, timeout=self.start_timeout)
        self.placement = Placement.initial(tuple(sorted(conns)), self.config.n_kv_heads, self.n_ffn_shards)
        self._load_weights(self.placement)
        self.state = "serving"
        logger.info(
            "tensor-parallel replica serving on %d ranks: %s", self.n_ranks, self.placement.describe()
        )

    def _accept(
        self, listener: Listener, processes: dict[int, subprocess.Popen[bytes]]
    ) -> dict[int, Connection]:
        conns: dict[int, Connection] = {}
        deadline = time.monotonic() + self.start_timeout
        # accept() blocks; a watchdog closes the listener if a rank dies or the deadline passes.
        failed: list[str] = []

        def watchdog() -> None:
            while len(conns) < len(processes) and not failed:
                dead = [r for r, p in processes.items() if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    failed.append(f"rank {dead[0]} exited" if dead else "ranks did not connect in time")
                    listener.close()
                    return
                time.sleep(0.1)

        threading.Thread(target=watchdog, daemon=True).start()
        try:
            while len(conns) < len(processes):
                conn = listener.accept()
                hello = conn.recv()
                conns[int(hello[1])] = conn
        except OSError:
            for p in processes.values():
                p.kill()
            raise EngineUnavailableError(
                f"the tensor-parallel ranks did not start: {failed[0] if failed else 'accept failed'}"
            ) from None
        return conns

    def close(self) -> None:
        """Stop every rank."""
        self.state = "failed" if self.state != "failed" else self.state
        for rank in self._ranks.values():
            try:
                rank.conn.send(("stop",))
            except OSError:
                pass
            rank.conn.close()
        for rank in self._ranks.values():
            try:
                rank.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rank.process.kill()
                rank.process.wait()
        self._ranks.clear()
        self._tmp.cleanup()

    # --- messaging ---------------------------------------------------------------------------------------------
    def _send(self, rank: int, message: tuple[Any, ...]) -> None:
        held = self._ranks.get(rank)
        if held is None:
            raise RankLost(rank, "already gone")
        try:
            held.conn.send(message)
        except (OSError, EOFError) as exc:
            raise RankLost(rank, f"send failed: {exc}") from None

    def _recv(self, rank: int, timeout: float | None = None) -> Any:
        conn = self._ranks[rank].conn
        wait = self.step_timeout if timeout is None else timeout
        try:
            if not conn.poll(wait):
                raise RankLost(rank, f"no answer in {wait:g} s")
            answer = conn.recv()
        except (OSError, EOFError) as exc:
            raise RankLost(rank, f"connection closed ({type(exc).__name__})") from None
        return answer

    def _all(self, messages: dict[int, tuple[Any, ...]], timeout: float | None = None) -> dict[int, Any]:
        """Send each rank its message, then collect every answer: the ranks work in parallel.

        Every rank that was sent a message is read from even after another fails, so no stale answer is left in
        a survivor's socket to be taken for the answer to the next message.
        """
        lost: list[RankLost] = []
        sent = []
        for rank, message in messages.items():
            try:
                self._send(rank, message)
                sent.append(rank)
            except RankLost as exc:
                lost.append(exc)
        answers = {}
        for rank in sent:
            try:
                answers[rank] = self._recv(rank, timeout)
            except RankLost as exc:
                lost.append(exc)
        if lost:
            raise lost[0]
        errors = [f"rank {rank}: {a[1]}" for rank, a in answers.items() if a[0] == "error"]
        if errors:
            raise RankError("; ".join(errors))
        return {rank: a[1] for rank, a in answers.items()}

    def _load_weights(self, placement: Placement) -> int:
        answers = self._all(
            {w: ("load", *placement.weights_of(w)) for w in placement.ranks}, timeout=self.start_timeout
        )
        return sum(int(a["bytes"]) for a in answers.values())

    # --- requests ----------------------------------------------------------------------------------------------
    def open(self, request_id: str, max_length: int) -> RequestState:
        """Admit a request: its base rank is the least loaded one (fewest cache tokens reserved by open requests)."""
        with self._lock:
            if request_id in self.requests:
                raise ValueError(f"request {request_id} is already open")
            cfg = self.config
            shape = (cfg.n_kv_heads, cfg.n_blocks, max_length, cfg.head_dim)
            while True:
                placement = self._serving_placement()
                load = [0] * placement.degree
                for other in self.requests.values():
                    load[other.base % placement.degree] += other.max_length
                base = min(range(placement.degree), key=lambda r: (load[r], r))
                try:
                    self._all(
                        {
                            w: ("open", request_id, max_length, self._cache_heads(placement, w, base))
                            for w in placement.ranks
                        }
                    )
                except RankLost as exc:
                    self._recover(exc)
                    continue
                req = RequestState(
                    request_id,
                    base,
                    max_length,
                    keys=np.empty(shape, np.float32),
                    values=np.empty(shape, np.float32),
                )
                self.requests[request_id] = req
                return req

    def close_request(self, request_id: str) -> None:
        """Free a request's caches everywhere (a lost rank's are gone already)."""
        req = self.requests.pop(request_id, None)
        if req is None or self.placement is None:
            return
        try:
            self._all({w: ("close", request_id) for w in self.placement.ranks})
        except RankLost as exc:
            with self._lock:
                self._recover(exc)  # the request is gone already: nothing of it is restored

    def check(self) -> None:
        """Recover now from a rank whose process has exited (a loss found between steps)."""
        with self._lock:
            if self.state != "serving":
                return
            for rank in list(self._ranks.values()):
                code = rank.process.poll()
                if code is not None:
                    self._recover(RankLost(rank.id, f"process exited with code {code}"))
                    return

    def _cache_heads(self, placement: Placement, worker: int, base: int) -> list[int]:
        """The heads `worker` keeps a cache of for a request: its own, and replicated ones it computes anywhere."""
        heads = set(placement.tp_heads[placement.position(worker)])
        if any(placement.dp_owner(base, i) == worker for i in range(self.config.n_blocks)):
            heads.update(placement.replicated)
        return sorted(heads)

    def _serving_placement(self) -> Placement:
        if self.placement is None or self.state == "failed":
            raise EngineUnavailableError("the tensor-parallel replica is not serving")
        return self.placement

    # --- stepping ----------------------------------------------------------------------------------------------
    def step(self, batch: Sequence[tuple[RequestState, np.ndarray]]) -> list[np.ndarray | None]:
        """Run every block on each request's new hidden states; a lost rank is recovered and the step rerun.

        A request closed meanwhile (its client went away) is left out of the batch; its output is None.
        """
        with self._lock:
            live = [(req, hidden) for req, hidden in batch if self.requests.get(req.id) is req]
            while live:
                placement = self._serving_placement()
                try:
                    out = self._step_once(placement, live)
                except RankLost as exc:
                    self._recover(exc)
                    continue
                for req, hidden in live:
                    req.length += hidden.shape[0]
                    req.inputs.append(hidden)
                by_id = {req.id: x for (req, _), x in zip(live, out, strict=True)}
                return [by_id.get(req.id) for req, _ in batch]
            return [None] * len(batch)

    def _step_once(
        self, placement: Placement, batch: Sequence[tuple[RequestState, np.ndarray]]
    ) -> list[np.ndarray]:
        cfg = self.config
        xs = [np.ascontiguousarray(h, dtype=np.float32) for _, h in batch]
        for req, h in batch:
            if req.length + h.shape[0] > req.max_length:
                raise ValueError(f"{req.id}: {h.shape[0]} tokens after {req.length} exceed {req.max_length}")
        for layer in range(cfg.n_blocks):
            messages = {
                w: (
                    "attn",
                    layer,
                    [
                        (req.id, x, placement.computes(w, layer, req.base))
                        for (req, _), x in zip(batch, xs, strict=True)
                    ],
                )
                for w in placement.ranks
            }
            answers = self._all(messages)
            for j, ((req, _), x) in enumerate(zip(batch, xs, strict=True)):
                partials: dict[int, np.ndarray] = {}
                t = x.shape[0]
                for w in placement.ranks:
                    for head, partial, k, v in answers[w][j]:
                        partials[head] = partial
                        req.keys[head, layer, req.length : req.length + t] = k
                        req.values[head, layer, req.length : req.length + t] = v
                xs[j] = x + reduce_partials([partials[h] for h in range(cfg.n_kv_heads)])
            answers = self._all(
                {
                    w: ("ffn", layer, [(req.id, x) for (req, _), x in zip(batch, xs, strict=True)])
                    for w in placement.ranks
                }
            )
            for j, x in enumerate(xs):
                shards: dict[int, np.ndarray] = {}
                for w in placement.ranks:
                    mine = sorted(placement.ffn[placement.position(w)])
                    shards.update(zip(mine, answers[w][j], strict=True))
                xs[j] = x + reduce_partials([shards[s] for s in range(self.n_ffn_shards)])
        return xs

    # --- recovery ----------------------------------------------------------------------------------------------
    def _recover(self, lost: RankLost) -> None:
        """Move the replica onto the survivors of `lost` and restore what it held."""
        began = time.perf_counter()
        before = self._serving_placement()
        self.state = "reconfiguring"
        logger.error("rank %d lost (%s): reconfiguring onto the survivors", lost.rank, lost.reason)
        rank = self._ranks.pop(lost.rank, None)
        if rank is not None:
            rank.process.kill()  # a hung rank must not come back with stale state
            rank.process.wait()
            rank.conn.close()
        if before.degree == 1:
            self.state = "failed"
            raise EngineUnavailableError(f"the replica's last rank was lost: {lost.reason}")
        after = before.without(lost.rank, self.config.n_kv_heads)
        report = RecoveryReport(
            lost_rank=lost.rank,
            reason=lost.reason,
            degree_before=before.degree,
            degree_after=after.degree,
            mode=self.recovery,
            weight_reload=self.weight_reload,
            requests=len(self.requests),
            placement=after.describe(),
        )
        try:
            t0 = time.perf_counter()
            self._all(
                {w: ("rollback", {r.id: r.length for r in self.requests.values()}) for w in after.ranks}
            )
            t1 = time.perf_counter()
            if self.weight_reload == "reshard":
                # The baseline: every survivor loads its new units from scratch, as a restarted engine would.
                self._all({w: ("load", (), ()) for w in after.ranks})
            report.weight_bytes = self._load_weights(after)
            t2 = time.perf_counter()
            if self.recovery == "backup":
                report.kv_bytes, report.kv_tokens = self._restore_from_backup(before, after)
            else:
                report.kv_tokens = self._reprefill(after)
            t3 = time.perf_counter()
        except RankError as exc:
            self.state = "failed"
            raise EngineUnavailableError(f"recovery after losing rank {lost.rank} failed: {exc}") from exc
        except RankLost as again:
            # Another rank died while recovering: start over from the placement we were moving to, restoring
            # every cache (this recovery may have stopped half-way through its restores).
            self.placement = after
            self._restore_everything = True
            report.total_s = time.perf_counter() - began
            self.recoveries.append(report)
            self._recover(again)
            return
        self._restore_everything = False
        self.placement = after
        report.rollback_s, report.weights_s, report.kv_s = t1 - t0, t2 - t1, t3 - t2
        report.total_s = time.perf_counter() - began
        self.recoveries.append(report)
        self.state = "serving"
        logger.warning(
            "reconfigured from TP%d to TP%d in %.3f s (weights %.3f s, KV %.3f s, %s)",
            report.degree_before,
            report.degree_after,
            report.total_s,
            report.weights_s,
            report.kv_s,
            report.mode,
        )

    def _restore_from_backup(self, before: Placement, after: Placement) -> tuple[int, int]:
        """Send each (request, head, block) cache whose owner changed from the host backup to its new owner."""
        sent, tokens = 0, 0
        messages: dict[int, list[tuple[Any, ...]]] = {w: [] for w in after.ranks}
        for req in self.requests.values():
            old_base, new_base = req.base % before.degree, req.base % after.degree
            req.base = new_base
            for head in range(self.config.n_kv_heads):
                moved: dict[int, list[int]] = {}
                for layer in range(self.config.n_blocks):
                    new = after.owner(head, layer, new_base)
                    if self._restore_everything or before.owner(head, layer, old_base) != new:
                        moved.setdefault(new, []).append(layer)
                for worker, layers in moved.items():
                    n = req.length
                    keys = np.ascontiguousarray(req.keys[head, layers, :n])
                    values = np.ascontiguousarray(req.values[head, layers, :n])
                    messages[worker].append(("restore", req.id, head, n, layers, keys, values))
                    tokens += n * len(layers)
        # Each rank takes its restores in turn; the ranks work in parallel.
        pending = {w: list(m) for w, m in messages.items() if m}
        while pending:
            batch = {w: m.pop(0) for w, m in pending.items()}
            sent += sum(int(v) for v in self._all(batch).values())
            pending = {w: m for w, m in pending.items() if m}
        return sent, tokens

    def _reprefill(self, after: Placement) -> int:
        """Rebuild every open request's caches on the new placement by running its inputs again as one chunk."""
        tokens = 0
        for req in self.requests.values():
            req.base %= after.degree
            self._all({w: ("close", req.id) for w in after.ranks})
            self._all(
                {
                    w: ("open", req.id, req.max_length, self._cache_heads(after, w, req.base))
                    for w in after.ranks
                }
            )
            if not req.inputs:
                continue
            hidden = np.concatenate(req.inputs)
            req.length = 0
            self._step_once(after, [(req, hidden)])
            req.length = hidden.shape[0]
            req.inputs = [hidden]
            tokens += hidden.shape[0]
        return tokens
