"""Stage 2: continuous batching over replicas; exact single-request timing, load laws, preemption, routing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from opentela.errors import ConfigError
from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.roofline import step_time
from opentela.scheduler.simulator import EngineLimits, ReplicaSpec, simulate
from opentela.scheduler.workload import LengthDist, Trace, Workload, poisson_trace

MODEL = load_model("Llama-3.1-8B")
A100 = builtin_catalog()["A100-80G"]


def burst(inputs: list[int], outputs: list[int], at: float = 0.0) -> Trace:
    n = len(inputs)
    return Trace(np.full(n, at), np.array(inputs), np.array(outputs), np.zeros(n, dtype=np.int64))


def light_trace(rate: float, seconds: float = 60.0, seed: int = 3) -> Trace:
    w = Workload("m", rate, LengthDist(400, 100), LengthDist(100, 25))
    return poisson_trace([w], seconds, np.random.default_rng(seed))


def test_a_lone_request_takes_one_prefill_and_output_minus_one_decode_steps() -> None:
    spec = ReplicaSpec(MODEL, A100)
    result = simulate([spec], burst([100], [10], at=5.0))
    prefill = step_time(MODEL, A100, prefill=[100])
    decodes = sum(step_time(MODEL, A100, decode=[100 + j]) for j in range(1, 10))
    assert result.ttft[0] == pytest.approx(prefill)
    assert result.e2e[0] == pytest.approx(prefill + decodes)
    assert result.tpot[0] == pytest.approx(decodes / 9)


def test_light_load_throughput_equals_the_arrival_rate() -> None:
    trace = light_trace(rate=2.0, seconds=120.0)
    result = simulate([ReplicaSpec(MODEL, A100)], trace)
    m = result.metrics()
    assert m["completed"] == len(trace)
    # Little's law with almost no queueing: requests in the system = rate x time in the system, and what
    # comes in goes out at the same rate.
    span = trace.arrival[-1] - trace.arrival[0]
    assert (len(trace) - 1) / span == pytest.approx(2.0, rel=0.2)
    assert m["throughput_rps"] == pytest.approx(len(trace) / (np.nanmax(result.finish) - trace.arrival[0]))
    alone = step_time(MODEL, A100, prefill=[400]) + 99 * step_time(MODEL, A100, decode=[450])
    assert m["e2e_mean"] == pytest.approx(alone, rel=0.25)


def test_latency_grows_with_the_rate() -> None:
    base = light_trace(rate=1.0, seconds=400.0)
    spec = ReplicaSpec(MODEL, A100)
    means = [simulate([spec], base.scaled(r)).metrics()["e2e_mean"] for r in (0.5, 2, 8, 32, 128, 512)]
    assert all(a <= b * 1.01 for a, b in itertools.pairwise(means)), means
    assert means[-1] > 5 * means[0]


def test_full_kv_cache_preempts_and_every_request_still_finishes() -> None:
    spec = ReplicaSpec(load_model("Llama-2-13b"), builtin_catalog()["A100-40G"])
    capacity = spec.kv_capacity_tokens
    n = 2 * capacity // 2000 + 4
    result = simulate([spec], burst([1000] * n, [1000] * n))
    assert result.preemptions > 0
    assert np.isfinite(result.finish).all()
    roomy = ReplicaSpec(load_model("Llama-2-13b"), builtin_catalog()["H200"])
    assert simulate([roomy], burst([1000] * 4, [1000] * 4)).preemptions == 0


def test_requests_longer_than_the_kv_cache_are_rejected() -> None:
    spec = ReplicaSpec(MODEL, A100)
    result = simulate([spec], burst([100, spec.kv_capacity_tokens], [10, 10]))
    assert result.rejected == 1 and np.isfinite(result.finish[0]) and np.isnan(result.finish[1])


def test_max_seqs_one_serves_requests_one_after_another() -> None:
    spec = ReplicaSpec(MODEL, A100, limits=EngineLimits(max_seqs=1))
    result = simulate([spec], burst([200] * 3, [20] * 3))
    e2e = np.sort(result.e2e)
    assert e2e[1] == pytest.approx(2 * e2e[0]) and e2e[2] == pytest.approx(3 * e2e[0])


def test_batch_token_budget_delays_prefills() -> None:
    small = ReplicaSpec(MODEL, A100, limits=EngineLimits(max_batched_tokens=1000))
    big = ReplicaSpec(MODEL, A100)
    trace = burst([800] * 4, [5] * 4)
    assert simulate([small], trace).ttft.max() > simulate([big], trace).ttft.max()


def test_more_replicas_behind_the_router_cut_latency_under_load() -> None:
    trace = light_trace(rate=60.0, seconds=30.0)
    spec = ReplicaSpec(MODEL, A100)
    one = simulate([spec], trace).metrics()["e2e_mean"]
    four = simulate([spec] * 4, trace)
    assert four.metrics()["e2e_mean"] < one / 2
    counts = np.bincount(four.replica, minlength=4)
    assert counts.min() > 0.8 * len(trace) / 4  # least-outstanding routing spreads the work


def test_weighted_groups_route_by_share() -> None:
    trace = light_trace(rate=5.0, seconds=60.0)
    spec = ReplicaSpec(MODEL, A100)
    result = simulate([spec, spec], trace, groups=[(0, [0], 0.9), (0, [1], 0.1)])
    counts = np.bincount(result.replica, minlength=2)
    assert counts[0] / len(trace) == pytest.approx(0.9, abs=0.05)


def test_a_model_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not fit"):
        simulate([ReplicaSpec(load_model("Llama-3.3-70B-Instruct"), A100)], burst([10], [10]))
