"""Performance profiles (interpolation, file form) and the headroom arithmetic and shadow validation built on them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela.engines.headroom import InstanceLoad, RequestState, Slo, pick_instance, shadow_validate
from opentela.engines.profile import PerformanceProfile, powers_of_two
from opentela.errors import ConfigError


def linear_profile(prefill_per_token: float = 1e-3, decode_base: float = 0.01) -> PerformanceProfile:
    """A profile whose true times are linear in each axis, so interpolation must be exact everywhere inside."""
    lengths = powers_of_two(4096, 64)
    batches = powers_of_two(64)
    return PerformanceProfile(
        model="m",
        hardware="test",
        device="cpu",
        prefill_lengths=lengths,
        prefill_s=tuple(prefill_per_token * n for n in lengths),
        decode_batches=batches,
        decode_lengths=lengths,
        decode_s=tuple(tuple(decode_base + 1e-4 * b + 1e-6 * ctx for ctx in lengths) for b in batches),
        kv_bytes_per_token=1000,
    )


def test_powers_of_two_end_at_the_limit() -> None:
    assert powers_of_two(4096, 64) == (64, 128, 256, 512, 1024, 2048, 4096)
    assert powers_of_two(100) == (1, 2, 4, 8, 16, 32, 64, 100)


@given(st.integers(64, 4096), st.integers(1, 64), st.floats(64, 4096))
def test_interpolation_is_exact_for_linear_truth(length: int, batch: int, ctx: float) -> None:
    p = linear_profile()
    assert p.prefill_time(length) == pytest.approx(1e-3 * length)
    assert p.decode_time(batch, ctx) == pytest.approx(0.01 + 1e-4 * batch + 1e-6 * ctx)


def test_interpolation_uses_the_nearest_samples_and_extends_the_ends() -> None:
    p = PerformanceProfile(
        "m", "t", "gpu", (100, 200, 400), (1.0, 2.0, 10.0), (1, 2), (100,), ((1.0,), (3.0,))
    )
    assert p.prefill_time(150) == pytest.approx(1.5)
    assert p.prefill_time(300) == pytest.approx(6.0)  # between 200 and 400 only
    assert p.prefill_time(500) == pytest.approx(14.0)  # the last segment extended
    assert p.prefill_time(0) == 0.0  # extended down, never negative
    assert p.decode_time(1, 5000) == 1.0 and p.decode_time(3, 1) == pytest.approx(5.0)
    assert p.decode_time(0, 100) == 0.0


def test_a_profile_survives_its_file_and_its_id_ignores_provenance(tmp_path: Path) -> None:
    p = linear_profile()
    p.save(tmp_path / "p.json")
    back = PerformanceProfile.load(tmp_path / "p.json")
    assert back == p and back.profile_id == p.profile_id
    other = PerformanceProfile.from_dict({**p.to_dict(), "meta": {"engine": "x"}})
    assert other.profile_id == p.profile_id
    slower = PerformanceProfile.from_dict({**p.to_dict(), "prefill_s": [t * 2 for t in p.prefill_s]})
    assert slower.profile_id != p.profile_id


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device": "tpu"}, "cpu or gpu"),
        ({"prefill_lengths": [64, 64, 128, 256, 512, 1024, 2048]}, "strictly increasing"),
        ({"prefill_s": [1.0]}, "one prefill time"),
        ({"decode_s": [[0.1]]}, "grid"),
        ({"format": 99}, "unknown profile format"),
        ({"model": None, "hardware": None, "decode_batches": "x"}, "malformed"),
    ],
)
def test_a_bad_profile_is_refused_with_the_reason(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PerformanceProfile.from_dict({**linear_profile().to_dict(), **change})


def test_headroom_follows_eq_1() -> None:
    r = RequestState(start=10.0, slo=Slo(2.0, 0.25), input_tokens=100, output_tokens=4)
    assert r.headroom(11.0) == pytest.approx(10 + 2 + 0.25 * 4 - 11)
    assert Slo.llm_mesh(100) == Slo(2.0, 0.25) and Slo.llm_mesh(2048) == Slo(4.0, 0.25)


def test_the_turn_goes_to_the_least_headroom() -> None:
    a = InstanceLoad(linear_profile(), [RequestState(0.0, Slo(2, 0.25), 10, 3)])
    b = InstanceLoad(linear_profile(), [RequestState(0.5, Slo(2, 0.25), 10, 0)])
    idle = InstanceLoad(linear_profile())
    assert pick_instance([a, b, idle], now=1.0) == 1
    assert pick_instance([idle], now=1.0) is None


def test_shadow_validation_accepts_room_and_names_each_failure() -> None:
    now = 100.0
    light = InstanceLoad(linear_profile(), [RequestState(now - 1, Slo(2, 0.25), 100, 10)])
    assert shadow_validate([light], 0, RequestState(now, Slo(2, 0.25), 512), now).ok
    # (1) its own prefill cannot finish within its TTFT: 4096 tokens at 1 ms each is 4.1 s > 2 s.
    slow_prefill = shadow_validate([light], 0, RequestState(now, Slo(2, 0.25), 4096), now)
    assert (slow_prefill.ok, slow_prefill.case) == (False, "ttft")
    # (2) a running request due soon would wait behind the new prefill (1.1 s here).
    due = InstanceLoad(linear_profile(), [RequestState(now - 2.0, Slo(2, 0.25), 100, 1)])
    delayed = shadow_validate([due], 0, RequestState(now, Slo(5, 0.25), 1000), now)
    assert (delayed.ok, delayed.case) == (False, "delays_running")
    # (3) the node's decode round would outgrow the TPOT SLO: 3 busy instances of 0.08 s rounds each.
    busy = [
        InstanceLoad(linear_profile(decode_base=0.08), [RequestState(now, Slo(2, 0.25), 64, 50)])
        for _ in range(3)
    ]
    crowded = shadow_validate(busy, 0, RequestState(now, Slo(2, 0.25), 64), now)
    assert (crowded.ok, crowded.case) == (False, "node_tpot")


def test_requests_already_late_do_not_block_a_new_one() -> None:
    now = 100.0
    late = InstanceLoad(linear_profile(), [RequestState(now - 50, Slo(2, 0.25), 100, 1)])
    assert shadow_validate([late], 0, RequestState(now, Slo(2, 0.25), 128), now).ok
