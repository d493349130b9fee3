"""Routing policy plumbing: registration, lookup by name or import path, and the random policy's spread."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from opentela._types import Lifecycle
from opentela.errors import ConfigError
from opentela.gateway.policies import POLICIES, RoutedRequest, create_policy, register_policy
from opentela.gateway.policies.random_policy import RandomPolicy
from opentela.registry.record import NodeRecord


def rec(i: int) -> NodeRecord:
    return NodeRecord(
        session_id=f"s{i}", peer_id=f"p{i}", provider_id="x", lifecycle=Lifecycle.SERVING, version=1
    )


class EchoFirstPolicy:
    """An operator's policy loaded by import path in the test below."""

    name = "first"

    def __init__(self, **_: object) -> None:
        pass

    def pick(self, candidates, request):
        return candidates[0]

    def on_request_start(self, target, request) -> None:
        pass

    def on_request_end(self, target, request, *, ok, latency_s) -> None:
        pass


def test_builtin_random_is_registered_and_default() -> None:
    assert "random" in POLICIES
    assert isinstance(create_policy("random"), RandomPolicy)
    assert isinstance(create_policy("RANDOM"), RandomPolicy)


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown routing policy 'no-such-policy'; known: .*random"):
        create_policy("no-such-policy")
    with pytest.raises(ConfigError, match="cannot load"):
        create_policy("no.such.module:Thing")


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_policy("random")(type("Another", (), {}))


def test_operator_policy_by_import_path() -> None:
    policy = create_policy(f"{__name__}:EchoFirstPolicy")
    assert policy.pick([rec(1), rec(2)], RoutedRequest("r", "m", False, 0)).session_id == "s1"


def test_random_policy_is_uniform() -> None:
    policy = RandomPolicy(random.Random(7))
    cands = [rec(i) for i in range(4)]
    counts = Counter(policy.pick(cands, RoutedRequest("r", "m", False, 0)).session_id for _ in range(4000))
    assert set(counts) == {"s0", "s1", "s2", "s3"}
    assert all(850 < c < 1150 for c in counts.values()), counts


def req(model: str = "m", tokens: int = 0) -> RoutedRequest:
    return RoutedRequest("r", model, False, 0, tokens=tokens)


def test_every_builtin_is_registered() -> None:
    assert {"random", "round_robin", "weighted", "least_loaded", "least_loaded_tokens"} <= set(POLICIES)


def test_round_robin_takes_turns_in_a_stable_order() -> None:
    policy = create_policy("round_robin")
    cands = [rec(i) for i in (3, 1, 2)]
    picks = [policy.pick(cands, req()).session_id for _ in range(9)]
    assert picks == ["s1", "s2", "s3"] * 3
    # each model keeps its own turn
    assert policy.pick(cands, req("other")).session_id == "s1"


def gpu_rec(i: int, probed: str | None = None, **settings: object) -> NodeRecord:
    from opentela.registry.record import ModelEntry

    gpus = [{"name": probed, "memory_mib": 81920}] if probed else []
    return NodeRecord(
        session_id=f"s{i}",
        peer_id=f"p{i}",
        provider_id="x",
        lifecycle=Lifecycle.SERVING,
        version=1,
        hardware={"gpus": gpus},
        models=(ModelEntry("m", "vllm", settings),),
    )


def test_replica_weight_prefers_explicit_metadata_then_gpu_class() -> None:
    from opentela.gateway.policies.weights import CPU_WEIGHT, replica_weight

    assert replica_weight(gpu_rec(1, "NVIDIA H100 80GB HBM3"), "m") == 1.0
    assert replica_weight(gpu_rec(1, "NVIDIA A100-SXM4-80GB"), "m") == 0.6
    assert replica_weight(gpu_rec(1, "NVIDIA GH200 480GB"), "m") == 1.2  # not read as H200
    assert replica_weight(gpu_rec(1, "NVIDIA H100", throughput=500), "m") == 500
    assert replica_weight(gpu_rec(1, None, gpu="H200"), "m") == 1.4  # a declared (simulated) GPU
    assert replica_weight(gpu_rec(1), "m") == CPU_WEIGHT
    assert replica_weight(gpu_rec(1, "Some Future GPU"), "m") == 1.0  # unknown: by memory (80 GiB)


def test_weighted_spreads_in_proportion_to_weights() -> None:
    from opentela.gateway.policies import WeightedPolicy

    policy = WeightedPolicy(random.Random(3))
    cands = [gpu_rec(1, "H100"), gpu_rec(2, "A100"), gpu_rec(3, None, weight=0.4)]
    counts = Counter(policy.pick(cands, req()).session_id for _ in range(20000))
    total = 1.0 + 0.6 + 0.4
    for sid, weight in (("s1", 1.0), ("s2", 0.6), ("s3", 0.4)):
        assert abs(counts[sid] / 20000 - weight / total) < 0.02, counts


def test_least_loaded_tracks_in_flight_requests() -> None:
    from opentela.gateway.policies import LeastLoadedPolicy

    policy = LeastLoadedPolicy(rng=random.Random(1))
    a, b, c = rec(1), rec(2), rec(3)
    r1, r2, r3 = req(), req(), req()
    first = policy.pick([a, b, c], r1)
    policy.on_request_start(first, r1)
    second = policy.pick([a, b, c], r2)
    policy.on_request_start(second, r2)
    third = policy.pick([a, b, c], r3)
    policy.on_request_start(third, r3)
    assert {first.session_id, second.session_id, third.session_id} == {"s1", "s2", "s3"}
    policy.on_request_end(second, r2, ok=True, latency_s=0.1)
    assert policy.pick([a, b, c], req()) is second
    for target, r in ((first, r1), (third, r3)):
        policy.on_request_end(target, r, ok=False, latency_s=0.1)
    assert policy.in_flight == {} and policy.pending_tokens == {}  # nothing left behind


def test_least_loaded_by_tokens_weighs_long_requests() -> None:
    policy = create_policy("least_loaded_tokens")
    a, b = rec(1), rec(2)
    policy.on_request_start(a, req(tokens=5000))
    for _ in range(3):
        policy.on_request_start(b, req(tokens=100))
    assert policy.pick([a, b], req()) is b  # three short requests weigh less than one long one
    assert create_policy("least_loaded").pick([a, b], req()) in (a, b)


def test_least_loaded_spreads_ties_at_random() -> None:
    from opentela.gateway.policies import LeastLoadedPolicy

    policy = LeastLoadedPolicy(rng=random.Random(5))
    cands = [rec(i) for i in range(3)]
    counts = Counter(policy.pick(cands, req()).session_id for _ in range(3000))
    assert all(800 < n < 1200 for n in counts.values()), counts
