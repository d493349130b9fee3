"""Serving simulator laws over random traces: determinism, causality, conservation of requests."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela.scheduler.hardware import builtin_catalog
from opentela.scheduler.models import load_model
from opentela.scheduler.simulator import EngineLimits, ReplicaSpec, simulate
from opentela.scheduler.workload import Trace

SPEC = ReplicaSpec(
    load_model("Qwen3-1.7B"),
    builtin_catalog()["RTX-4090"],
    limits=EngineLimits(max_seqs=8, max_batched_tokens=2048),
)

requests = st.lists(
    st.tuples(st.floats(0, 20, allow_nan=False), st.integers(1, 3000), st.integers(1, 400)),
    min_size=1,
    max_size=40,
)


def as_trace(rows: list[tuple[float, int, int]]) -> Trace:
    rows = sorted(rows)
    arrival, inp, out = (np.array(c) for c in zip(*rows, strict=True))
    return Trace(
        arrival.astype(float), inp.astype(np.int64), out.astype(np.int64), np.zeros(len(rows), dtype=np.int64)
    )


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(1, 3))
def test_every_request_finishes_after_it_starts(rows: list[tuple[float, int, int]], replicas: int) -> None:
    trace = as_trace(rows)
    result = simulate([SPEC] * replicas, trace)
    assert result.rejected == 0 and np.isfinite(result.finish).all()
    assert (result.first_token > trace.arrival).all()
    assert (result.finish >= result.first_token).all()
    one_token = trace.output_len == 1
    assert (result.finish[one_token] == result.first_token[one_token]).all()


@settings(max_examples=30, deadline=None)
@given(requests)
def test_the_simulator_is_deterministic(rows: list[tuple[float, int, int]]) -> None:
    trace = as_trace(rows)
    a, b = simulate([SPEC, SPEC], trace), simulate([SPEC, SPEC], trace)
    assert np.array_equal(a.finish, b.finish) and a.preemptions == b.preemptions


@settings(max_examples=30, deadline=None)
@given(requests, st.integers(1, 2))
def test_bulk_decode_steps_change_nothing(rows: list[tuple[float, int, int]], replicas: int) -> None:
    trace = as_trace(rows)
    bulk = simulate([SPEC] * replicas, trace)
    step_by_step = simulate([SPEC] * replicas, trace, fast_forward=False)
    np.testing.assert_allclose(bulk.finish, step_by_step.finish, rtol=1e-9)
    np.testing.assert_allclose(bulk.first_token, step_by_step.first_token, rtol=1e-9)
    assert bulk.preemptions == step_by_step.preemptions
