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
    with pytest.raises(ConfigError, match=r"built-ins: .*random"):
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
