"""The slo_headroom policy: shadow-validated admission, CPU first, bin-packing, and asking for more when full."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from opentela._types import Lifecycle, PeerId, SessionId
from opentela.engines.headroom import Slo
from opentela.engines.profile import PerformanceProfile, powers_of_two
from opentela.errors import ConfigError
from opentela.gateway._config import GatewayConfig
from opentela.gateway.policies import RoutedRequest, create_policy
from opentela.gateway.policies.slo_headroom_policy import SloHeadroomPolicy, parse_slos
from opentela.registry.record import ModelEntry, NodeRecord

MODEL = "m"


def profile(decode_s: float, prefill_per_token: float = 1e-4, device: str = "cpu") -> PerformanceProfile:
    """Decode iterations cost `decode_s` per request in the batch (so batches fill up), prefill is linear."""
    lengths, batches = powers_of_two(4096, 64), powers_of_two(64)
    return PerformanceProfile(
        MODEL,
        device,
        device,
        lengths,
        tuple(prefill_per_token * n for n in lengths),
        batches,
        lengths,
        tuple(tuple(decode_s * b for _ in lengths) for b in batches),
    )


def node(name: str, prof: PerformanceProfile | None, gpu: bool = False) -> NodeRecord:
    settings = {"profile": prof.profile_id} if prof is not None else {}
    return NodeRecord(
        session_id=SessionId(f"s-{name}"),
        peer_id=PeerId(f"p-{name}"),
        provider_id=name,
        lifecycle=Lifecycle.SERVING,
        version=1,
        hardware={"gpus": [{"memory_mib": 80000}] if gpu else []},
        models=(ModelEntry(MODEL, "x", settings),),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(*profiles: PerformanceProfile) -> tuple[SloHeadroomPolicy, Clock]:
    clock = Clock()
    p = SloHeadroomPolicy({x.profile_id: x for x in profiles}, clock=clock, rng=random.Random(1))
    return p, clock


def request(i: int, tokens: int = 100) -> RoutedRequest:
    return RoutedRequest(f"r{i}", MODEL, False, 100, tokens=tokens + 50, input_tokens=tokens)


def load(p: SloHeadroomPolicy, target: NodeRecord, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        p.on_request_start(target, request(i))


def test_cpu_before_gpu_and_the_largest_batch_first() -> None:
    cpu_profile, gpu_profile = profile(0.01), profile(0.001, device="gpu")
    p, _ = policy(cpu_profile, gpu_profile)
    cpu_a, cpu_b, gpu = node("a", cpu_profile), node("b", cpu_profile), node("g", gpu_profile, gpu=True)
    assert p.pick([gpu, cpu_a, cpu_b], request(99)).provider_id in ("a", "b")
    load(p, cpu_b, 3)
    load(p, cpu_a, 1, start=10)
    assert p.pick([gpu, cpu_a, cpu_b], request(99)).provider_id == "b"  # bin-packing: the fuller CPU replica


def test_a_full_replica_is_passed_over_and_none_left_asks_for_more() -> None:
    cpu_profile = profile(0.02)
    p, _ = policy(cpu_profile)
    asked: list[str] = []
    p.on_overload = asked.append
    full, spare = node("full", cpu_profile), node("spare", cpu_profile)
    load(p, full, 12)  # a decode round of 13 would take 0.29 s > 0.25 s TPOT
    assert p.pick([full, spare], request(99)).provider_id == "spare" and not asked
    load(p, spare, 12, start=50)
    chosen = p.pick([full, spare], request(99))
    assert asked == [MODEL] and p.refused == 1 and chosen.provider_id in ("full", "spare")


def test_requests_ending_free_the_room_again() -> None:
    cpu_profile = profile(0.02)
    p, _ = policy(cpu_profile)
    asked: list[str] = []
    p.on_overload = asked.append
    only = node("only", cpu_profile)
    load(p, only, 12)
    p.pick([only], request(99))
    assert asked == [MODEL]
    for i in range(6):
        p.on_request_end(only, request(i), ok=True, latency_s=1.0)
    p.pick([only], request(98))
    assert asked == [MODEL]  # validated this time: nobody asked again


def test_a_long_prompt_that_cannot_meet_its_ttft_is_refused_where_prefill_is_slow() -> None:
    slow_prefill, fast_prefill = profile(0.01, prefill_per_token=2e-3), profile(0.01, prefill_per_token=1e-4)
    p, _ = policy(slow_prefill, fast_prefill)
    slow, fast = node("slow", slow_prefill), node("fast", fast_prefill, gpu=True)
    # 1,500 tokens: TTFT SLO max(2, 1500/512) = 2.9 s; the slow node needs 3.3 s (+10 %), so the GPU it is.
    assert p.pick([slow, fast], request(1, tokens=1500)).provider_id == "fast"


def test_replicas_without_a_known_profile_serve_only_as_the_fallback() -> None:
    known = profile(0.01)
    p, _ = policy(known)
    asked: list[str] = []
    p.on_overload = asked.append
    unknown = node("u", None)
    assert p.pick([unknown, node("k", known)], request(1)).provider_id == "k"
    assert p.pick([unknown], request(2)).provider_id == "u" and asked == [MODEL]


def test_built_from_the_gateway_configuration(tmp_path: Path) -> None:
    prof = profile(0.01)
    prof.save(tmp_path / "cpu.json")
    built = create_policy("slo_headroom", GatewayConfig(profiles_dir=str(tmp_path), slos=("m=1.5,0.1",)))
    assert isinstance(built, SloHeadroomPolicy)
    assert list(built.profiles) == [prof.profile_id] and built.slo_for("m", 10_000) == Slo(1.5, 0.1)
    assert built.slo_for("other", 1024) == Slo(2.0, 0.25)
    for bad in ("m=1", "m=a,b", "=1,1", "m=0,1"):
        with pytest.raises(ConfigError):
            parse_slos([bad])
    with pytest.raises(ConfigError, match="not a directory"):
        create_policy("slo_headroom", GatewayConfig(profiles_dir=str(tmp_path / "nope")))
