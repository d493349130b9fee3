"""Stage 2 of the simulator: discrete-event continuous batching over data-parallel replicas behind a router."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from opentela.errors import ConfigError
from opentela.scheduler.hardware import Device
from opentela.scheduler.models import ModelSpec
from opentela.scheduler.prefix_cache import BLOCK_TOKENS, PrefixCache
from opentela.scheduler.roofline import Precision, StepCost
from opentela.scheduler.workload import Trace

POLICIES = ("fcfs", "spf")
"""Admission orders: first come first served, shortest prompt first."""


@dataclass(frozen=True)
class EngineLimits:
    """The serving engine's batching limits (vLLM's names in brackets)."""

    max_seqs: int = 256
    """Sequences in one batch [max_num_seqs]."""
    max_batched_tokens: int = 8192
    """New tokens in one step [max_num_batched_tokens]; a longer prompt runs alone."""
    memory_utilization: float = 0.9
    """Share of device memory the engine may use for weights, activations and KV cache."""
    step_overhead_s: float = 0.0
    """Fixed host-side cost per step (scheduling, sampling); 0 is the pure roofline."""
    activation_reserve_gib: float = 1.0
    """Per-device memory kept for activations and the runtime, outside the KV cache."""
    chunked_prefill: bool = False
    """Split prompts into chunks [enable_chunked_prefill]: every step decodes all running sequences and fills
    the rest of `max_batched_tokens` with prompt chunks; off, a prompt is prefilled whole in one step."""
    policy: str = "fcfs"
    """Order in which waiting requests are admitted: `fcfs` (arrival) or `spf` (shortest prompt first)."""
    prefix_cache_tokens: int = 0
    """Tokens of prompt prefix the replica keeps for reuse (LRU over 16-token blocks); 0: no prefix cache."""
    prefix_hit_ratio: float = 0.0
    """Without prefix hashes in the trace: the share of every prompt found cached (whole blocks)."""
    slot_runs: bool = False
    """llama.cpp's server over a per-slot (non-unified) KV cache: a sequence holds one of `max_seqs` slots,
    handed out least recently used first, and a step runs as one micro-batch per run of consecutive slots
    (one token of each sequence of the run), each prompt's further tokens in micro-batches of their own."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown scheduling policy {self.policy!r}; known: {', '.join(POLICIES)}")
        if not 0.0 <= self.prefix_hit_ratio <= 1.0 or self.prefix_cache_tokens < 0:
            raise ConfigError("prefix_hit_ratio must be in [0, 1] and prefix_cache_tokens >= 0")


@dataclass(frozen=True)
class ReplicaSpec:
    """One data-parallel replica: a model on `tp` devices of one type."""

    model: ModelSpec
    device: Device
    tp: int = 1
    precision: Precision = field(default_factory=Precision)
    limits: EngineLimits = field(default_factory=EngineLimits)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit next to the weights (negative: the weights alone do not fit)."""
        usable = self.tp * (self.device.memory_bytes * self.limits.memory_utilization)
        usable -= self.tp * self.limits.activation_reserve_gib * 1024**3
        free = usable - self.model.weight_bytes(self.precision.weights)
        return int(free // self.model.kv_bytes_per_token(self.precision.kv_cache))

    def check(self) -> None:
        """Raise ConfigError unless the replica can hold its weights and at least one long request."""
        if self.tp > max(self.device.devices_per_node, 1):
            raise ConfigError(f"tp {self.tp} exceeds the {self.device.devices_per_node} devices of a node")
        if self.kv_capacity_tokens < 1024:
            raise ConfigError(
                f"{self.model.name} does not fit on {self.tp} x {self.device.name} "
                f"(KV room for {max(self.kv_capacity_tokens, 0)} tokens)"
            )

    @cached_property
    def cost(self) -> StepCost:
        """The tabulated step-time model of this replica."""
        return StepCost(
            self.model,
            self.device,
            self.tp,
            self.precision,
            max_tokens=self.limits.max_batched_tokens,
            max_seqs=self.limits.max_seqs,
        )


@dataclass
class SimResult:
    """Per-request times (NaN where a request never finished) and replica counters."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output_len: np.ndarray
    model: np.ndarray
    preemptions: int = 0
    rejected: int = 0
    steps: int = 0
    busy_s: list[float] = field(default_factory=list)
    replica: np.ndarray | None = None
    """Index of the replica each request was routed to (-1: rejected)."""
    prompt_computed: np.ndarray | None = None
    """Prompt tokens each request had computed (preempted sequences recompute their output as prompt)."""
    prompt_cached: np.ndarray | None = None
    """Prompt tokens each request found in the prefix cache."""
    decoded_tokens: int = 0
    """Output tokens produced, over all replicas."""

    @property
    def ttft(self) -> np.ndarray:
        """Time to first token per request."""
        return self.first_token - self.arrival

    @property
    def e2e(self) -> np.ndarray:
        """End-to-end latency per request."""
        return self.finish - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        """Time per output token after the first (NaN for one-token answers)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                self.output_len > 1, (self.finish - self.first_token) / (self.output_len - 1), np.nan
            )

    def window_tps(self, warmup: float = 1 / 3) -> float:
        """Output tokens per second produced while requests keep arriving, after the first `warmup` share of
        the arrival period (no ramp-up, no drain at the end); each request's tokens are spread evenly from
        its first token to its finish."""
        if len(self.arrival) < 2:
            return float("nan")
        begin, stop = float(self.arrival.min()), float(self.arrival.max())
        start = begin + warmup * (stop - begin)
        done = np.isfinite(self.finish)
        first, finish, out = self.first_token[done], self.finish[done], self.output_len[done].astype(float)
        length = np.maximum(finish - first, 1e-12)
        overlap = np.clip(np.minimum(finish, stop) - np.maximum(first, start), 0.0, None)
        # One-token answers have no duration: count them if they fall inside the window.
        inside = np.where(
            finish > first, overlap / length, ((first >= start) & (first <= stop)).astype(float)
        )
        return float((out * inside).sum() / (stop - start)) if stop > start else float("nan")

    def offered_tps(self) -> float:
        """Output tokens per second the arrivals ask for."""
        if len(self.arrival) < 2:
            return float("nan")
        span = float(self.arrival.max() - self.arrival.min())
        return float(self.output_len.sum()) / span if span > 0 else float("nan")

    def metrics(self) -> dict[str, float]:
        """Mean and p50/p90/p99 of TTFT, TPOT and E2E (seconds), throughput and counters."""
        done = np.isfinite(self.finish)
        out: dict[str, float] = {"requests": float(len(self.arrival)), "completed": float(done.sum())}
        for name, values in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)):
            v = values[done & np.isfinite(values)]
            out[f"{name}_mean"] = float(v.mean()) if len(v) else float("nan")
            for q in (50, 90, 99):
                out[f"{name}_p{q}"] = float(np.percentile(v, q)) if len(v) else float("nan")
        span = float(np.nanmax(self.finish) - self.arrival.min()) if done.any() else float("nan")
        out["throughput_rps"] = float(done.sum()) / span if done.any() and span > 0 else 0.0
        out["throughput_tps"] = float(self.output_len[done].sum()) / span if done.any() and span > 0 else 0.0
        out["window_tps"] = self.window_tps()
        out["offered_tps"] = self.offered_tps()
        out["preemptions"] = float(self.preemptions)
        out["rejected"] = float(self.rejected)
        return out


class _Replica:
    """The continuous-batching state machine of one replica (vLLM-style: whole or chunked prefill, optional
    prefix cache, recompute preempted sequences, newest first)."""

    __slots__ = (
        "base",
        "busy_s",
        "cache",
        "cached",
        "capacity",
        "computed",
        "cost",
        "finishing",
        "hashes",
        "kv",
        "limits",
        "pending",
        "preemptions",
        "prefilling",
        "running",
        "slot_of",
        "slots",
        "steps",
        "tokens_out",
        "version",
        "waiting",
        "waiting_spf",
    )

    def __init__(self, spec: ReplicaSpec, computed: np.ndarray, cached: np.ndarray) -> None:
        spec.check()
        self.cost, self.limits, self.capacity = spec.cost, spec.limits, spec.kv_capacity_tokens
        self.waiting: deque[int] = deque()
        self.waiting_spf: list[tuple[int, int]] = []  # heap of (prompt tokens to compute, rid)
        self.running: dict[int, None] = {}  # insertion order = admission order
        self.prefilling: dict[int, int] = {}  # rid -> prompt tokens in the KV cache so far, admission order
        self.base: dict[int, tuple[int, int]] = {}  # rid -> (step index after prefill, tokens generated then)
        self.finishing: list[tuple[int, int, int]] = []  # (finish step, version, rid)
        self.version: dict[int, int] = {}
        self.pending: list[
            tuple[int, int, int]
        ] = []  # (rid, chunk, tokens before it) in the step now running
        self.cache = PrefixCache(spec.limits.prefix_cache_tokens // BLOCK_TOKENS)
        self.hashes: Sequence[Sequence[str]] | None = None
        self.computed, self.cached = computed, cached
        self.slots: deque[int] = deque(range(spec.limits.max_seqs))  # free slots, least recently used first
        self.slot_of: dict[int, int] = {}
        self.kv = 0
        self.steps = 0
        self.preemptions = 0
        self.tokens_out = 0
        self.busy_s = 0.0

    def queued(self) -> int:
        """Requests waiting for admission."""
        return len(self.waiting) + len(self.waiting_spf)

    def outstanding(self) -> int:
        """Requests routed here and not finished."""
        return self.queued() + len(self.running) + len(self.prefilling)

    def enqueue(self, rid: int, tokens: int, front: bool = False) -> None:
        """Queue a request for admission (`front`: a preempted one, ahead of the others under FCFS)."""
        if self.limits.policy == "spf":
            heapq.heappush(self.waiting_spf, (tokens, rid))
        elif front:
            self.waiting.appendleft(rid)
        else:
            self.waiting.append(rid)

    def _next(self) -> int:
        return self.waiting_spf[0][1] if self.waiting_spf else self.waiting[0]

    def _pop(self) -> None:
        if self.waiting_spf:
            heapq.heappop(self.waiting_spf)
        else:
            self.waiting.popleft()

    def generated(self, rid: int) -> int:
        """Tokens a running sequence has generated so far."""
        step, gen = self.base[rid]
        return gen + self.steps - step

    def fast_forward(self, budget_s: float) -> float:
        """Run, in one vectorised go, the decode-only steps that end within `budget_s` and finish no sequence.

        Only valid when nothing waits: then no step admits anyone and each one is fully determined. Returns
        the time they took (0.0 if none)."""
        decodes = len(self.running)
        if self.queued() or self.pending or self.prefilling or not decodes or not self.finishing:
            return 0.0
        limit = min(self.finishing[0][0] - self.steps - 1, (self.capacity - self.kv) // decodes)
        if limit < 8:  # not worth the NumPy call
            return 0.0
        contexts = self.kv + decodes * np.arange(limit, dtype=float)
        passes = self._passes([(rid, 1, True) for rid in self.running]) if self.limits.slot_runs else None
        ends = np.cumsum(self.cost.decode_times(decodes, contexts, passes) + self.limits.step_overhead_s)
        n = int(np.searchsorted(ends, budget_s, side="right"))
        if n == 0:
            return 0.0
        self.steps += n
        self.kv += n * decodes
        self.tokens_out += n * decodes
        took = float(ends[n - 1])
        self.busy_s += took
        return took

    def _hit(self, rid: int, n: int) -> int:
        # Cached prompt tokens for a request about to be admitted; the last token is always computed, so that
        # the step has logits to sample the first output token from.
        if self.hashes is not None and self.cache.capacity_blocks:
            h = self.cache.peek(self.hashes[rid]) * BLOCK_TOKENS
        elif self.limits.prefix_hit_ratio:
            h = int(self.limits.prefix_hit_ratio * n) // BLOCK_TOKENS * BLOCK_TOKENS
        else:
            return 0
        return max(min(h, n - 1), 0)

    def plan_step(self, inp: np.ndarray, gen_done: np.ndarray) -> float:
        """Form the next batch and return its duration (0.0: nothing to run)."""
        running, limits = self.running, self.limits
        # Every decoder needs one more KV slot: preempt the newest sequences until they fit.
        while running and self.kv + len(running) > self.capacity:
            rid, _ = running.popitem()
            self._release(rid)
            gen = self.generated(rid)
            gen_done[rid] = gen
            self.kv -= int(inp[rid]) + gen
            self.version[rid] = self.version.get(rid, 0) + 1
            self.enqueue(rid, int(inp[rid]) + gen, front=True)
            self.preemptions += 1
        decodes = len(running)
        budget = limits.max_batched_tokens - decodes
        room = self.capacity - self.kv - decodes - len(self.prefilling)
        chunks = self.pending
        for rid, done in self.prefilling.items():  # prompts part-way through their chunks go first
            c = min(int(inp[rid]) + int(gen_done[rid]) - done, budget)
            if c <= 0:
                break
            chunks.append((rid, c, done))
            budget -= c
        while self.queued() and decodes + len(self.prefilling) < limits.max_seqs:
            rid = self._next()
            n = int(inp[rid]) + int(gen_done[rid])  # a preempted sequence recomputes what it generated
            h = self._hit(rid, n)
            alone = not decodes and not chunks
            c = min(n - h, budget) if limits.chunked_prefill else n - h
            if c <= 0 or (c > budget and not alone) or n + 1 > room:
                break
            self._pop()
            if self.hashes is not None and self.cache.capacity_blocks:
                self.cache.match(self.hashes[rid])
            self.prefilling[rid] = h
            if limits.slot_runs:
                self.slot_of[rid] = self.slots.popleft()
            self.kv += n  # the whole prompt's KV is reserved at admission
            self.cached[rid] += h
            chunks.append((rid, c, h))
            budget -= c
            room -= n + 1
        if not decodes and not chunks:
            return 0.0
        sum_n = cached = 0
        sum_n2 = 0.0
        completing = 0
        batch = [(rid, 1, True) for rid in running]
        for rid, c, k in chunks:
            self.computed[rid] += c
            sum_n += c
            sum_n2 += self.cost.prompt_n2(c, k)
            cached += k
            done = k + c >= int(inp[rid]) + int(gen_done[rid])
            completing += done
            batch.append((rid, c, done))
        passes = self._passes(batch) if limits.slot_runs else None
        t = (
            self.cost.time(
                decodes + sum_n,
                decodes + completing,
                self.kv - self._reserved(inp, gen_done),
                decodes,
                sum_n,
                sum_n2,
                cached,
                passes,
            )
            + limits.step_overhead_s
        )
        self.busy_s += t
        return t

    def _release(self, rid: int) -> None:
        # A finished or preempted sequence gives its slot back, now the most recently used.
        slot = self.slot_of.pop(rid, None)
        if slot is not None:
            self.slots.append(slot)

    def _passes(self, batch: list[tuple[int, int, bool]]) -> list[tuple[int, int]]:
        """Micro-batches (rows, rows sampled) of a step of (rid, new tokens, sampled) under llama.cpp's
        sequential split: one token of every sequence of a run of consecutive slots together, the rest of each
        prompt chunk alone in passes of at most the step model's micro-batch."""
        ubatch = self.cost.device.step.ubatch_tokens or 1 << 30
        ordered = sorted(batch, key=lambda item: self.slot_of[item[0]])
        passes: list[tuple[int, int]] = []
        tails: list[tuple[int, bool]] = []
        run_rows = run_sampled = 0
        last = -2
        for rid, tokens, sampled in ordered:
            slot = self.slot_of[rid]
            if slot != last + 1 and run_rows:
                passes.append((run_rows, run_sampled))
                run_rows = run_sampled = 0
            last = slot
            run_rows += 1
            run_sampled += sampled and tokens == 1
            if tokens > 1:
                tails.append((tokens - 1, sampled))
        if run_rows:
            passes.append((run_rows, run_sampled))
        for rest, sampled in tails:
            while rest > 0:
                rows = min(rest, ubatch)
                rest -= rows
                passes.append((rows, int(sampled and rest == 0)))
        return passes

    def _reserved(self, inp: np.ndarray, gen_done: np.ndarray) -> int:
        # KV reserved for prompts still being prefilled is not yet read by the decoders.
        return sum(int(inp[rid]) + int(gen_done[rid]) for rid in self.prefilling)

    def finish_step(
        self,
        now: float,
        inp: np.ndarray,
        out: np.ndarray,
        gen_done: np.ndarray,
        first: np.ndarray,
        end: np.ndarray,
    ) -> None:
        """Account for the step that ended at `now`: one token for every decoder and every completed prompt."""
        self.kv += len(self.running)
        self.tokens_out += len(self.running)
        self.steps += 1
        k = self.steps
        for rid, c, before in self.pending:
            n = int(inp[rid]) + int(gen_done[rid])
            if before + c < n:
                self.prefilling[rid] = before + c
                continue
            del self.prefilling[rid]
            if self.hashes is not None:
                self.cache.insert(self.hashes[rid])
            gen = int(gen_done[rid]) + 1
            self.tokens_out += 1
            self.kv += 1
            if np.isnan(first[rid]):
                first[rid] = now
            if gen >= out[rid]:
                self.kv -= int(inp[rid]) + gen
                end[rid] = now
                self._release(rid)
                continue
            self.running[rid] = None
            self.base[rid] = (k, gen)
            v = self.version.get(rid, 0)
            heapq.heappush(self.finishing, (k + int(out[rid]) - gen, v, rid))
        self.pending.clear()
        heap = self.finishing
        while heap and heap[0][0] <= k:
            _, v, rid = heapq.heappop(heap)
            if v != self.version.get(rid, 0) or rid not in self.running:
                continue  # stale entry of a preempted sequence
            del self.running[rid]
            self._release(rid)
            self.kv -= int(inp[rid]) + int(out[rid])
            end[rid] = now


def simulate(
    replicas: Sequence[ReplicaSpec],
    trace: Trace,
    groups: Sequence[tuple[int, Sequence[int], float]] | None = None,
    rng: np.random.Generator | None = None,
    fast_forward: bool = True,
    prefixes: Sequence[Sequence[str]] | None = None,
) -> SimResult:
    """Run `trace` through `replicas` until every request finishes.

    `groups` are (model index, replica indices, routing share) triples: a request for a model picks a group
    with probability proportional to its share, then the replica of that group with the fewest outstanding
    requests. Without groups, every request goes to the least-loaded replica of all. `fast_forward` runs
    stretches of decode-only steps in bulk (the same result up to float rounding; turn it off only to check).
    `prefixes` gives each request's chained 16-token block hashes (`TraceRecord.prefix_hashes`) for the
    replicas' prefix caches; without them a cache serves `EngineLimits.prefix_hit_ratio` of every prompt.
    """
    n = len(trace)
    inp, out = trace.input_len, trace.output_len
    first = np.full(n, np.nan)
    end = np.full(n, np.nan)
    gen_done = np.zeros(n, dtype=np.int64)
    routed = np.full(n, -1, dtype=np.int64)
    computed = np.zeros(n, dtype=np.int64)
    cached = np.zeros(n, dtype=np.int64)
    states = [_Replica(spec, computed, cached) for spec in replicas]
    if prefixes is not None:
        if len(prefixes) != n:
            raise ConfigError(f"{len(prefixes)} prefix hash lists for {n} requests")
        for state in states:
            state.hashes = prefixes
    if groups is None:
        groups = [(int(m), range(len(states)), 1.0) for m in np.unique(trace.model)]
    by_model: dict[int, tuple[list[Sequence[int]], np.ndarray]] = {}
    for model, members, share in groups:
        lists, shares = by_model.get(model, ([], np.zeros(0)))
        if share > 0 and len(members):
            by_model[model] = ([*lists, list(members)], np.append(shares, share))
    by_model = {m: (lists, np.cumsum(s) / s.sum()) for m, (lists, s) in by_model.items()}
    picks = (rng or np.random.default_rng(0)).random(n)
    rejected = 0
    busy: list[tuple[float, int]] = []
    active = [False] * len(states)

    def start(i: int, now: float) -> None:
        # Until the next arrival nothing can join this replica: skip its decode-only steps in bulk.
        if fast_forward:
            now += states[i].fast_forward((arrivals[a] if a < n else float("inf")) - now)
        dt = states[i].plan_step(inp, gen_done)
        if dt > 0:
            heapq.heappush(busy, (now + dt, i))
            active[i] = True
        else:
            active[i] = False

    arrivals = trace.arrival
    a = 0
    while a < n or busy:
        if a < n and (not busy or arrivals[a] <= busy[0][0]):
            now = float(arrivals[a])
            entry = by_model.get(int(trace.model[a]))
            if entry is None:
                rejected += 1
                a += 1
                continue
            lists, cumulative = entry
            g = 0 if len(lists) == 1 else int(np.searchsorted(cumulative, picks[a], side="right"))
            members = lists[min(g, len(lists) - 1)]
            i = min(members, key=lambda r: states[r].outstanding())
            if inp[a] + out[a] > states[i].capacity:
                rejected += 1
            else:
                routed[a] = i
                states[i].enqueue(a, int(inp[a]))
                if not active[i]:
                    start(i, now)
            a += 1
            continue
        now, i = heapq.heappop(busy)
        states[i].finish_step(now, inp, out, gen_done, first, end)
        start(i, now)
    return SimResult(
        trace.arrival,
        first,
        end,
        out,
        trace.model,
        preemptions=sum(s.preemptions for s in states),
        rejected=rejected,
        steps=sum(s.steps for s in states),
        busy_s=[s.busy_s for s in states],
        replica=routed,
        prompt_computed=computed,
        prompt_cached=cached,
        decoded_tokens=sum(s.tokens_out for s in states),
    )
