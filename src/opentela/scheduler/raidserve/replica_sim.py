"""Continuous batching on one tensor-parallel replica under any `Layout`, step by step (RaidServe's evaluation).

Each step runs every decoding request one token and fills the rest of the token budget with prompt chunks; its
duration is `LayoutCost.time` of the step's work per base rank, so the slowest rank of every layer sets the pace.
Requests get a base rank when they arrive (round robin, or the rank with the least pending data-parallel work:
the paper's load-aware routing). Prompt chunks are chosen FIFO, one request after another (vanilla chunked
prefill), or by Alg. 1: token by token to the least-loaded rank, so one long prompt cannot fill a step alone.
KV memory is tracked per rank (a request of base r puts `kv_bytes_per_token(rank, r)` on each rank); when a rank
runs out, the newest running request is preempted and recomputed later, as vLLM does. `reconfigure` moves the
replica to another layout after a failure, keeping or losing the running requests' caches.

Alg. 1's token cost is taken as one per token (its balance is over token counts); the paper's per-token cost
grows with the context, which changes which request a rank's token comes from, not how many each rank gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from opentela.scheduler.hardware import Device
from opentela.scheduler.raidserve.cost import LayoutCost, RankBatch
from opentela.scheduler.raidserve.layout import Layout
from opentela.scheduler.simulator import EngineLimits

Routing = Literal["round_robin", "least_loaded"]
Chunking = Literal["fifo", "adaptive"]


@dataclass
class _Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    base: int = 0
    done_prefill: int = 0
    generated: int = 0
    first_token: float | None = None
    last_token: float | None = None
    max_gap: float = 0.0

    @property
    def context(self) -> int:
        return self.done_prefill + self.generated

    @property
    def prefill_left(self) -> int:
        return self.prompt - self.done_prefill


@dataclass
class ReplicaStats:
    """What a run produced."""

    generated: int = 0
    prefilled: int = 0
    finished: int = 0
    preempted: int = 0
    steps: int = 0
    busy_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    max_tbt: list[float] = field(default_factory=list)


def water_fill(available: np.ndarray, budget: int, load: np.ndarray | None = None) -> np.ndarray:
    """Alg. 1 in closed form for unit token costs: give tokens one at a time to the least-loaded rank that
    still has some, until `budget` is spent; returns the tokens per rank."""
    load = np.zeros(len(available)) if load is None else load.astype(float)
    take = np.zeros(len(available), dtype=np.int64)
    left = int(min(budget, available.sum()))
    while left > 0:
        open_ranks = np.flatnonzero(take < available)
        level = load[open_ranks] + take[open_ranks]
        low = level.min()
        lowest = open_ranks[level == low]
        # Raise the lowest ranks together to the next level (or until one runs out or the budget does).
        higher = level[level > low]
        step = int(
            min((higher.min() - low) if higher.size else left, (available[lowest] - take[lowest]).min())
        )
        step = max(step, 1)
        if step * len(lowest) > left:
            give = np.zeros(len(lowest), dtype=np.int64)
            give[: left % len(lowest)] = 1
            give += left // len(lowest)
            take[lowest] += give
            break
        take[lowest] += step
        left -= step * len(lowest)
    return take


class ReplicaSim:
    """One replica's continuous batching, advanced by `run_until`."""

    def __init__(
        self,
        layout: Layout,
        device: Device,
        *,
        routing: Routing = "least_loaded",
        chunking: Chunking = "adaptive",
        limits: EngineLimits | None = None,
        token_budget: int = 8192,
        growth_reserve_steps: int = 64,
    ) -> None:
        self.device, self.routing, self.chunking = device, routing, chunking
        self.limits = limits or EngineLimits()
        self.token_budget, self.growth_reserve_steps = token_budget, growth_reserve_steps
        self.now = 0.0
        self.stats = ReplicaStats()
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []
        self._next_base = 0
        self._submitted = 0
        self._set_layout(layout)

    def _set_layout(self, layout: Layout) -> None:
        self.layout = layout
        self.cost = LayoutCost(layout, self.device, max_tokens=self.token_budget)
        n = layout.ranks
        # kv[b, r]: bytes one token of a request with base b puts on rank r.
        self._kv = np.array([[layout.kv_bytes_per_token(r, b) for r in range(n)] for b in range(n)])
        usable = layout.usable_bytes(self.device, self.limits)
        self._capacity = np.array([usable - layout.weight_bytes(r) for r in range(n)])
        if (self._capacity <= 0).any():
            raise ValueError(f"{layout.model.name} does not fit on {n} x {self.device.name} as {layout.mode}")

    def __repr__(self) -> str:
        return f"<ReplicaSim {self.layout.mode} x{self.layout.ranks} t={self.now:.1f}s>"

    # --- requests ----------------------------------------------------------------------------------------------
    def submit(self, arrival: float, prompt: int, output: int, prefilled: bool = False) -> None:
        """A request arriving at `arrival` (seconds) with a prompt and an output length in tokens; `prefilled`:
        its prompt's cache arrives computed (a decode instance behind a prefill one, as in the paper's 4.2)."""
        self._submitted += 1
        req = _Request(self._submitted, arrival, max(prompt, 1), max(output, 1))
        if prefilled:
            req.done_prefill = req.prompt
        self.waiting.append(req)

    def _pending_work(self) -> np.ndarray:
        work = np.zeros(self.layout.ranks)
        for req in self.running:
            work[req.base] += req.prefill_left + req.context
        return work

    def _route(self, req: _Request) -> None:
        if self.routing == "round_robin":
            req.base = self._next_base % self.layout.ranks
            self._next_base += 1
        else:
            req.base = int(np.argmin(self._pending_work()))

    def _usage(
        self, extra: _Request | None = None, extra_tokens: int = 0, growth_steps: int = 0
    ) -> np.ndarray:
        per_base = np.zeros(self.layout.ranks)
        for req in self.running:
            per_base[req.base] += req.context + growth_steps
        if extra is not None:
            per_base[extra.base] += extra_tokens
        return per_base @ self._kv

    def _admit(self) -> None:
        """Start waiting requests, oldest first, while their prompts fit in every rank's cache."""
        while (
            self.waiting and self.waiting[0].arrival <= self.now and len(self.running) < self.limits.max_seqs
        ):
            req = self.waiting[0]
            self._route(req)
            # Room for the prompt and for every running request to grow a while, or the newest would be
            # preempted again at once (vLLM keeps a watermark of free blocks for the same reason).
            if (self._usage(req, req.prompt + 1, self.growth_reserve_steps) > self._capacity).any():
                break
            self.waiting.pop(0)
            self.running.append(req)

    # --- one step ----------------------------------------------------------------------------------------------
    def _chunks(self, budget: int) -> dict[int, int]:
        """Prompt tokens each prefilling request gets this step."""
        prefilling = [r for r in self.running if r.prefill_left > 0]
        out: dict[int, int] = {}
        if budget <= 0 or not prefilling:
            return out
        # With no replicated head there is no data-parallel work to balance: the layout is plain TP, and the
        # replica schedules prompts as a plain TP engine does (the paper: RaidServe degenerates to standard TP).
        if self.chunking == "fifo" or not self.layout.replicated:
            for req in prefilling:
                if budget <= 0:
                    break
                out[req.rid] = take = min(req.prefill_left, budget)
                budget -= take
            return out
        n = self.layout.ranks
        available = np.zeros(n, dtype=np.int64)
        for req in prefilling:
            available[req.base] += req.prefill_left
        per_rank = water_fill(available, budget)
        for req in prefilling:  # within a rank, its oldest prompt first
            take = int(min(req.prefill_left, per_rank[req.base]))
            if take:
                out[req.rid] = take
                per_rank[req.base] -= take
        return out

    def step(self) -> float:
        """Run one step; returns its duration (0 when there was nothing to run)."""
        self._admit()
        if not self.running:
            return 0.0
        n = self.layout.ranks
        decoding = [r for r in self.running if r.prefill_left == 0]
        chunks = self._chunks(self.token_budget - len(decoding))
        decodes, ctx, pre, n2 = (np.zeros(n) for _ in range(4))
        for req in decoding:
            decodes[req.base] += 1
            ctx[req.base] += req.context
        by_id = {r.rid: r for r in self.running}
        for rid, c in chunks.items():
            req = by_id[rid]
            pre[req.base] += c
            n2[req.base] += c * c + 2 * c * req.done_prefill
        duration = self.cost.time(RankBatch(decodes, ctx, pre, n2)) + self.limits.step_overhead_s
        self.now += duration
        self.stats.steps += 1
        self.stats.busy_s += duration
        for req in decoding:
            self._emit(req)
        for rid, c in chunks.items():
            req = by_id[rid]
            req.done_prefill += c
            self.stats.prefilled += c
            if req.prefill_left == 0:
                self._emit(req)  # the prompt's last chunk yields the first token
        self.running = [r for r in self.running if r.generated < r.output]
        self._relieve_memory()
        return duration

    def _emit(self, req: _Request) -> None:
        req.generated += 1
        self.stats.generated += 1
        if req.first_token is None:
            req.first_token = self.now
            self.stats.ttft.append(self.now - req.arrival)
        elif req.last_token is not None:
            req.max_gap = max(req.max_gap, self.now - req.last_token)
        req.last_token = self.now
        if req.generated >= req.output:
            self.stats.finished += 1
            self.stats.max_tbt.append(req.max_gap)

    def _relieve_memory(self) -> None:
        """Preempt the newest running requests while a rank holds more cache than it has (recompute later)."""
        while self.running and (self._usage() > self._capacity).any():
            req = self.running.pop()
            self.stats.preempted += 1
            # Recompute: the prompt and what it generated become the prompt of a fresh start.
            req.prompt, req.output = req.context, req.output - req.generated
            req.done_prefill, req.generated = 0, 0
            self.waiting.insert(0, req)

    def run_until(self, t: float) -> None:
        """Step until simulated time `t` (idle time jumps to the next arrival)."""
        while self.now < t:
            if self.step() == 0.0:
                future = [r.arrival for r in self.waiting if r.arrival > self.now]
                if not future:
                    self.now = t
                    break
                self.now = min(min(future), t)

    # --- failures ----------------------------------------------------------------------------------------------
    def reconfigure(self, layout: Layout, downtime_s: float, keep_cache: bool) -> None:
        """Move to `layout` after `downtime_s` without progress; without `keep_cache`, running requests recompute."""
        self.now += downtime_s
        self._set_layout(layout)
        for req in self.running:
            req.base %= layout.ranks
        if not keep_cache:
            for req in reversed(self.running):
                req.prompt, req.output = req.context, req.output - req.generated
                req.done_prefill, req.generated = 0, 0
                self.waiting.insert(0, req)
            self.running = []
        self._relieve_memory()
