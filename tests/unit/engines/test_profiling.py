"""Measuring a performance profile: against the simulated engine its timing model comes back, and the budget cuts
the grid into a rectangle."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from opentela.engines.base import free_port
from opentela.engines.profile import PerformanceProfile
from opentela.engines.profile_probe import DecodeRun, PrefillRun, PromptCalibration, steady_gaps
from opentela.engines.profiling import ProfileSettings, Sample, measure_profile, profile_engine
from opentela.engines.simulated_config import SimulatedConfig
from opentela.errors import ConfigError, EngineError, EngineUnavailableError, ModelNotFoundError
from sim_engine_process import start_engine, stop_engine

# Prefill 0.5 ms a prompt token on top of 5 ms; decode 5 ms a token plus 3 ms per other request decoding.
TIMED = SimulatedConfig(gpu="CPU", params_b=0.2, itl_per_active_ms=3.0)


@pytest.fixture(scope="module")
def timed_engine() -> Iterator[str]:
    proc, url = start_engine(TIMED)
    try:
        yield url
    finally:
        stop_engine(proc)


async def test_a_measured_profile_matches_the_simulated_timing(timed_engine: str, tmp_path: Path) -> None:
    settings = ProfileSettings(
        url=timed_engine + "/v1",
        model="sim-model",
        device="cpu",
        max_length=256,
        max_batch=4,
        decode_tokens=24,
    )
    samples: list[Sample] = []
    profile = await profile_engine(settings, samples.append)
    truth = TIMED.timing()

    # The prompts were calibrated on the engine's own counts, and the prefill axis holds those counts.
    assert profile.meta["calibration"]["reported"] is True
    assert profile.meta["prefill_lengths"] == "reported by the engine"
    for nominal, counted in zip((64, 128, 256), profile.prefill_lengths, strict=True):
        assert abs(counted - nominal) <= 2
    # Time to first token: the engine's ttft(prompt tokens), plus a loopback round trip and some noise.
    for length, seconds in zip(profile.prefill_lengths, profile.prefill_s, strict=True):
        assert -0.002 <= seconds - truth.ttft(length) <= 0.015 + 0.1 * truth.ttft(length), (length, seconds)
    slope = (profile.prefill_s[-1] - profile.prefill_s[0]) / (
        profile.prefill_lengths[-1] - profile.prefill_lengths[0]
    )
    assert slope == pytest.approx(truth.prefill_s_per_token, rel=0.15)
    # Decode: one iteration is itl(B), whatever the context (this timing model ignores it).
    assert profile.decode_batches == (1, 2, 4) and profile.decode_lengths == (64, 128, 256)
    for batch, row in zip(profile.decode_batches, profile.decode_s, strict=True):
        for seconds in row:
            assert seconds == pytest.approx(truth.itl(batch), rel=0.2, abs=0.001), (batch, row)
    assert profile.decode_time(3, 100) == pytest.approx(truth.itl(3), rel=0.2, abs=0.001)

    # One progress sample per point, prefill first; every point measured, none cut.
    assert [(s.kind, s.batch, s.length) for s in samples] == [
        *[("prefill", 1, n) for n in (64, 128, 256)],
        *[("decode", b, n) for b in (1, 2, 4) for n in (64, 128, 256)],
    ]
    assert profile.meta["truncated"] is False and profile.meta["measured"]["cut"] == []
    assert profile.meta["engine_url"] == timed_engine and profile.meta["prefill_repeat"] == 3

    profile.save(tmp_path / "p.json")
    back = PerformanceProfile.load(tmp_path / "p.json")
    assert back == profile and back.meta == profile.meta and back.profile_id == profile.profile_id


async def test_an_unknown_model_is_named_with_what_the_engine_serves(timed_engine: str) -> None:
    with pytest.raises(ModelNotFoundError, match=r"does not serve 'other'; it serves: sim-model"):
        await profile_engine(ProfileSettings(url=timed_engine, model="other"))


async def test_an_unreachable_engine_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineUnavailableError, match=f"cannot reach the engine at {url}"):
        await profile_engine(ProfileSettings(url=url, model="m"))


async def test_failing_requests_stop_the_measurement() -> None:
    proc, url = start_engine(SimulatedConfig(error_rate=1.0))
    try:
        with pytest.raises(EngineError, match="HTTP 500: simulated engine failure"):
            await profile_engine(ProfileSettings(url=url, model="sim-model"))
    finally:
        stop_engine(proc)


async def test_an_engine_dying_mid_stream_is_a_clear_error() -> None:
    proc, url = start_engine(SimulatedConfig(crash_after=3))  # two to calibrate, one to warm up
    try:
        with pytest.raises(EngineError, match=f"the engine at {url} broke off a response"):
            await profile_engine(ProfileSettings(url=url, model="sim-model"))
    finally:
        stop_engine(proc)


async def test_an_engine_with_fewer_slots_than_the_batch_ends_the_batches() -> None:
    proc, url = start_engine(SimulatedConfig(ttft_ms=5, itl_ms=5, max_concurrency=2))
    try:
        settings = ProfileSettings(url=url, model="sim-model", max_length=64, max_batch=8, decode_tokens=24)
        profile = await profile_engine(settings)
    finally:
        stop_engine(proc)
    assert profile.decode_batches == (1, 2) and profile.meta["batch_limit"] == 4
    assert profile.meta["truncated"] is True and profile.meta["measured"]["cut"] == []


class FakeTarget:
    """An engine that answers at once, except at the points named slow, which take `slow_s`."""

    base_url = "http://fake"
    model = "m"

    def __init__(
        self, slow: set[tuple[str, int, int]], slow_s: float, max_model_len: int | None = None
    ) -> None:
        self.slow, self.slow_s, self.max_model_len = slow, slow_s, max_model_len
        self.asked: list[tuple[str, int, int]] = []

    async def calibrate(self) -> PromptCalibration:
        return PromptCalibration()

    async def _take(self, point: tuple[str, int, int]) -> None:
        self.asked.append(point)
        if point in self.slow:
            await asyncio.sleep(self.slow_s)

    async def prefill(self, tokens: int) -> PrefillRun:
        await self._take(("prefill", 1, tokens))
        return PrefillRun(tokens * 1e-4, None)

    async def decode(self, batch: int, tokens: int, max_tokens: int) -> DecodeRun:
        await self._take(("decode", batch, tokens))
        return DecodeRun(1e-3 * batch + 1e-6 * tokens, 10, None, max_tokens)


def budgeted(**kw: int) -> ProfileSettings:
    return ProfileSettings(url="http://fake", model="m", repeat=1, max_sample_s=0.1, **kw)


async def test_the_budget_stops_the_lengths_where_prefill_gets_too_slow() -> None:
    target = FakeTarget({("prefill", 1, 256)}, slow_s=0.15)
    profile = await measure_profile(budgeted(max_length=1024, max_batch=2), target)
    assert profile.prefill_lengths == (64, 128, 256)  # the slow sample is kept, nothing longer is tried
    assert profile.meta["prefill_lengths"] == "estimated"  # the fake reports no token counts
    assert profile.decode_lengths == (64, 128, 256) and profile.decode_batches == (1, 2)
    assert ("prefill", 1, 512) not in target.asked and ("decode", 1, 512) not in target.asked
    assert profile.meta["truncated"] is True


async def test_a_row_cut_short_by_the_budget_is_dropped_and_ends_the_batches() -> None:
    # Batch 1 sets the lengths (up to its slow 128); batch 4 is too slow at its first length: the row goes.
    target = FakeTarget({("decode", 1, 128), ("decode", 4, 64)}, slow_s=0.15)
    profile = await measure_profile(budgeted(max_length=512, max_batch=16), target)
    assert profile.prefill_lengths == (64, 128, 256, 512)
    assert profile.decode_batches == (1, 2) and profile.decode_lengths == (64, 128)
    assert profile.decode_s == ((0.001064, 0.001128), (0.002064, 0.002128))
    assert profile.meta["measured"]["cut"] == [[4, 64]]
    assert profile.meta["measured"]["decode"] == [[1, 64], [1, 128], [2, 64], [2, 128]]
    assert not any(p[1] == 8 for p in target.asked)


async def test_a_row_slow_only_at_its_end_is_kept_and_ends_the_batches() -> None:
    target = FakeTarget({("decode", 2, 128)}, slow_s=0.15)
    profile = await measure_profile(budgeted(max_length=128, max_batch=8), target)
    assert profile.decode_batches == (1, 2) and profile.decode_lengths == (64, 128)
    assert profile.meta["measured"]["cut"] == []


def test_lengths_leave_room_for_the_output_in_the_context_window() -> None:
    s = ProfileSettings(url="u", model="m", max_length=2048)
    assert s.lengths() == (64, 128, 256, 512, 1024, 2048) and s.batches() == (1, 2, 4, 8, 16, 32)
    assert s.lengths(1024) == (64, 128, 256, 512)
    with pytest.raises(ConfigError, match="context window"):
        s.lengths(256)
    with pytest.raises(ConfigError):
        ProfileSettings(url="u", model="m", repeat=0)


def test_steady_gaps_cover_only_the_phase_when_every_stream_decodes() -> None:
    first = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    late = [2.5, 3.5, 4.5]  # its prefill ended at 2.5; it finished at 4.5
    # 3->4 of the first stream; 2.5->3.5 and 3.5->4.5 of the late one.
    assert steady_gaps([first, late]) == [1.0, 1.0, 1.0]
    assert steady_gaps([first, [1.0]]) == []
    calibration = PromptCalibration.fit((32, 512), (40, 520))
    assert calibration.overhead == pytest.approx(8) and calibration.per_word == pytest.approx(1)
    assert calibration.words_for(64) == 56
    assert PromptCalibration.fit((32, 512), (None, 520)) == PromptCalibration()
