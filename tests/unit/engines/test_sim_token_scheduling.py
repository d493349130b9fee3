"""The simulated engine hosts several models, and with token scheduling shares one executor among them by headroom."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from opentela.engines.headroom import RequestState, Slo
from opentela.engines.profile import PerformanceProfile
from opentela.engines.sim_scheduler import TokenExecutor, Turn
from opentela.engines.sim_timing import TimingModel
from opentela.engines.simulated import SimulatedConfig, SimulatedServer
from opentela.errors import ConfigError

MESSAGES = [{"role": "user", "content": "x" * 40}]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


async def stream_times(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[float]:
    """Arrival times of a stream's token chunks."""
    times = []
    async with http.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    times.append(time.monotonic())
    return times


def chat(model: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, **extra}


def flat_profile(model: str, prefill_s: float, decode_s: float) -> PerformanceProfile:
    return PerformanceProfile(
        model=model,
        hardware="test",
        device="cpu",
        prefill_lengths=(1, 4096),
        prefill_s=(prefill_s, prefill_s),
        decode_batches=(1, 64),
        decode_lengths=(1, 4096),
        decode_s=((decode_s, decode_s), (decode_s, decode_s)),
    )


# --- configuration -----------------------------------------------------------------------------------------------


def test_models_repeat_or_list_and_the_flags_round_trip() -> None:
    argv = [
        "--model",
        "a",
        "--model",
        "b,c",
        "--token-scheduling",
        "--slo",
        "a=1,0.1",
        "--profile",
        "b=/p.json",
    ]
    cfg = SimulatedConfig.from_argv(argv)
    assert cfg.models() == ("a", "b", "c") and cfg.scheduled()
    assert cfg.slos() == {"a": Slo(1.0, 0.1)} and cfg.profile_paths() == {"b": Path("/p.json")}
    assert SimulatedConfig.from_argv(cfg.to_argv()) == cfg
    assert SimulatedConfig.from_argv(["--model", "solo"]) == SimulatedConfig(model="solo")
    assert SimulatedConfig.from_argv([]).to_argv() == []
    # One model has nothing to share the executor with: the flag changes nothing.
    assert not SimulatedConfig(token_scheduling=True).scheduled()
    assert SimulatedConfig(model="a,b", slo=["a=1,0.1"]).slo == ("a=1,0.1",)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "a,a"},
        {"model": " , "},
        {"model": "a,b", "slo": ("z=1,0.1",)},
        {"model": "a,b", "slo": ("a=1",)},
        {"model": "a,b", "slo": ("a=1,0",)},
        {"model": "a,b", "slo": ("a=1,0.1", "a=2,0.2")},
        {"model": "a,b", "profile": ("a",)},
    ],
)
def test_bad_model_lists_slos_and_profiles_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        SimulatedConfig(**kwargs)


def test_the_timing_model_as_a_profile_gives_the_same_times() -> None:
    timing = TimingModel(0.01, 0.001, 0.005, 0.002)
    profile = timing.as_profile("m")
    for prompt in (0, 1, 7, 5000):
        assert profile.prefill_time(prompt) == pytest.approx(timing.ttft(prompt))
    for batch in (1, 2, 9, 64):
        assert profile.decode_time(batch, 3000) == pytest.approx(timing.itl(batch))


# --- the executor's decisions, step by step on a virtual clock ------------------------------------------------------


def run_turns(ex: TokenExecutor, now: float, limit: int = 1000) -> tuple[list[Turn], float]:
    """Play turns until every request is done; returns them and the clock at the end."""
    turns = []
    for _ in range(limit):
        chosen = ex.next_turn(now)
        if chosen is None:
            break
        turn, served = chosen
        now += turn.seconds
        ex.finish(turn, served)
        turns.append(turn)
    return turns, now


def test_the_least_headroom_gets_each_iteration() -> None:
    ex = TokenExecutor(
        {"tight": flat_profile("tight", 0.02, 0.01), "loose": flat_profile("loose", 0.02, 0.01)}
    )
    loose = ex.add("loose", RequestState(0.0, Slo(10.0, 10.0), 100), 20)
    # The loose request is under way when the tight one comes.
    for _ in range(3):
        chosen = ex.next_turn(0.0)
        assert chosen is not None
        ex.finish(*chosen)
    tight = ex.add("tight", RequestState(0.04, Slo(0.5, 0.04), 100), 10)
    turns, end = run_turns(ex, 0.04)
    models = [t.model for t in turns]
    # The tight request runs prefill and all its decodes back to back; the loose one waits with its slack.
    assert models == ["tight"] * 10 + ["loose"] * 17
    assert [t.kind for t in turns[:2]] == ["prefill", "decode"]
    assert all(t.headroom_s < 1.0 for t in turns[:10]) and all(t.headroom_s > 9 for t in turns[10:])
    assert tight.state.output_tokens == 10 and loose.state.output_tokens == 20
    assert tight.removed and loose.removed and ex.next_turn(end) is None
    stats = ex.stats["tight"]
    assert (stats.iterations, stats.prefills, stats.decodes, stats.tokens) == (10, 1, 9, 10)
    assert stats.busy_s == pytest.approx(0.02 + 9 * 0.01)


def test_equal_slos_interleave_and_the_node_time_is_the_sum() -> None:
    ex = TokenExecutor({"a": flat_profile("a", 0.01, 0.01), "b": flat_profile("b", 0.01, 0.01)})
    ex.add("a", RequestState(0.0, Slo(2.0, 0.25), 10), 30)
    ex.add("b", RequestState(0.0, Slo(2.0, 0.25), 10), 30)
    turns, end = run_turns(ex, 0.0)
    assert end == pytest.approx(0.6)  # 60 iterations of 10 ms on one executor
    # Neither instance ever gets more than a token ahead of the other: each turn serves the one behind.
    counts = {"a": 0, "b": 0}
    for t in turns:
        counts[t.model] += 1
        assert abs(counts["a"] - counts["b"]) <= 1
    assert counts == {"a": 30, "b": 30}


def test_a_removed_request_takes_no_more_iterations() -> None:
    ex = TokenExecutor({"a": flat_profile("a", 0.01, 0.01), "b": flat_profile("b", 0.01, 0.01)})
    gone = ex.add("a", RequestState(0.0, Slo(2.0, 0.25), 10), 100)
    stays = ex.add("a", RequestState(0.0, Slo(2.0, 0.25), 10), 3)
    chosen = ex.next_turn(0.0)
    assert chosen is not None and chosen[1] == [gone]
    ex.remove(gone)  # its client left during its prefill
    assert ex.finish(*chosen) == [] and gone.state.output_tokens == 0
    turns, _ = run_turns(ex, 0.01)
    assert [t.batch for t in turns] == [1, 1, 1] and stays.state.output_tokens == 3
    assert ex.running("a") == 0 and ex.stats["a"].tokens == 3


def test_zero_tokens_still_prefill_once() -> None:
    ex = TokenExecutor({"a": flat_profile("a", 0.01, 0.01), "b": flat_profile("b", 0.01, 0.01)})
    ticket = ex.add("a", RequestState(0.0, Slo(2.0, 0.25), 10), 0)
    turns, _ = run_turns(ex, 0.0)
    assert [t.kind for t in turns] == ["prefill"] and ticket.removed and ex.stats["a"].tokens == 0


# --- the engine over HTTP ---------------------------------------------------------------------------------------------


async def test_two_models_in_one_process_both_answer(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(model="m1,m2", ttft_ms=1, itl_ms=1)) as srv:
        assert srv.scheduler is None
        async with http.get(srv.base_url + "/v1/models") as resp:
            assert [e["id"] for e in (await resp.json())["data"]] == ["m1", "m2"]
        url = srv.base_url + "/v1/chat/completions"
        for model in ("m1", "m2"):
            async with http.post(url, json=chat(model, 3)) as resp:
                body = await resp.json()
            assert resp.status == 200 and body["model"] == model
            assert body["usage"]["completion_tokens"] == 3
        async with http.post(url, json={"messages": MESSAGES, "max_tokens": 1}) as resp:
            assert (await resp.json())["model"] == "m1"  # no model named: the first hosted
        async with http.post(url, json=chat("m3", 1)) as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
            assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
        async with http.post(srv.base_url + "/v1/embeddings", json={"model": "m2", "input": "hi"}) as resp:
            assert (await resp.json())["model"] == "m2"
        async with http.get(srv.base_url + "/health") as resp:
            health = await resp.json()
    assert health["requests"] == 4 and health["token_scheduling"] is False
    assert health["models"] == {"m1": {"active": 0, "requests": 2}, "m2": {"active": 0, "requests": 2}}


async def test_one_model_with_the_flag_serves_as_before(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(token_scheduling=True, ttft_ms=1, itl_ms=1)) as srv:
        assert srv.scheduler is None
        async with http.get(srv.base_url + "/health") as resp:
            assert set(await resp.json()) == {"status", "active", "requests"}


async def test_the_tight_model_gets_its_iterations_first(http: aiohttp.ClientSession) -> None:
    cfg = SimulatedConfig(
        model="loose,tight",
        token_scheduling=True,
        ttft_ms=10,
        itl_ms=10,
        slo=("loose=10,10", "tight=0.5,0.04"),
    )
    url_path = "/v1/chat/completions"
    async with SimulatedServer(cfg) as srv:
        assert srv.scheduler is not None
        url = srv.base_url + url_path
        loose_task = asyncio.create_task(stream_times(http, url, chat("loose", 40)))
        # The tight request comes while the loose one is streaming.
        while srv.scheduler.executor.stats["loose"].decodes < 2:  # noqa: ASYNC110 (polling a counter)
            await asyncio.sleep(0.005)
        tight_times = await stream_times(http, url, chat("tight", 15))
        loose_times = await loose_task
        async with http.get(srv.base_url + "/health") as resp:
            health = await resp.json()
        history = list(srv.scheduler.executor.history)
    # The scheduler's own decisions: from the tight prefill on, every turn is the tight model's until it is done.
    first = next(i for i, t in enumerate(history) if t.model == "tight")
    assert [t.model for t in history[first : first + 15]] == ["tight"] * 15
    assert history[first].kind == "prefill" and history[first + 15].model == "loose"
    assert max(t.headroom_s for t in history[first : first + 15]) < 1.0
    assert min(t.headroom_s for t in history if t.model == "loose") > 5.0
    models = health["models"]
    assert models["tight"]["tokens"] == 15 and models["loose"]["tokens"] == 40
    assert models["tight"]["last_headroom_s"] < models["loose"]["last_headroom_s"]
    # Observed on the wire: the tight stream keeps its pace; the loose one absorbs the delay in one long gap.
    assert len(tight_times) == 15 and len(loose_times) == 40
    tight_gaps = [b - a for a, b in itertools.pairwise(tight_times)]
    loose_gaps = [b - a for a, b in itertools.pairwise(loose_times)]
    assert statistics.median(tight_gaps) < 0.04
    assert max(loose_gaps) >= 0.12  # 15 tight iterations of 10 ms ran in between


async def test_models_share_the_throughput_of_one_executor(http: aiohttp.ClientSession) -> None:
    async def timed(srv: SimulatedServer, *models: str) -> float:
        url = srv.base_url + "/v1/chat/completions"

        async def one(model: str) -> None:
            async with http.post(url, json=chat(model, 30)) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 30

        t0 = time.monotonic()
        await asyncio.gather(*(one(m) for m in models))
        return time.monotonic() - t0

    shared = SimulatedConfig(model="a,b", token_scheduling=True, ttft_ms=10, itl_ms=10)
    async with SimulatedServer(shared) as srv:
        alone_a, alone_b = await timed(srv, "a"), await timed(srv, "b")
        together = await timed(srv, "a", "b")
        assert srv.scheduler is not None
        busy = {m: s.busy_s for m, s in srv.scheduler.executor.stats.items()}
    async with SimulatedServer(SimulatedConfig(model="a,b", ttft_ms=10, itl_ms=10)) as srv:
        separate = await timed(srv, "a", "b")
    # 30 iterations of 10 ms each alone; together the executor runs all 60 one after another.
    assert 0.28 <= alone_a < 0.6 and 0.28 <= alone_b < 0.6
    assert together >= 0.85 * (alone_a + alone_b)
    assert together < 1.5 * (alone_a + alone_b)
    assert busy == {"a": pytest.approx(0.6), "b": pytest.approx(0.6)}  # two runs each, 30 iterations apiece
    # Without token scheduling each model is its own instance and they overlap.
    assert separate < 0.75 * (alone_a + alone_b)


async def test_streams_count_usage_and_a_disconnect_leaves_the_scheduler(http: aiohttp.ClientSession) -> None:
    cfg = SimulatedConfig(model="a,b", token_scheduling=True, ttft_ms=2, itl_ms=5)
    async with SimulatedServer(cfg) as srv:
        assert srv.scheduler is not None
        url = srv.base_url + "/v1/chat/completions"
        body = chat("b", 4, stream=True, stream_options={"include_usage": True})
        async with http.post(url, json=body) as resp:
            payloads = [line.decode().strip() async for line in resp.content if line.startswith(b"data: ")]
        assert payloads[-1] == "data: [DONE]"
        usage = json.loads(payloads[-2][len("data: ") :])["usage"]
        assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == 14
        async with http.post(url, json=chat("a", 0)) as resp:
            assert (await resp.json())["usage"]["completion_tokens"] == 0

        resp = await http.post(url, json=chat("a", 10_000, stream=True))
        got = 0
        async for line in resp.content:
            got += line.startswith(b"data: ")
            if got == 3:
                break
        resp.close()  # the client goes away mid-stream
        executor = srv.scheduler.executor
        deadline = time.monotonic() + 5
        while executor.running("a") and time.monotonic() < deadline:  # noqa: ASYNC110 (polling a counter)
            await asyncio.sleep(0.01)
        assert executor.running("a") == 0
        iterations = executor.stats["a"].iterations
        await asyncio.sleep(0.05)
        assert executor.stats["a"].iterations == iterations  # no more turns for a request nobody reads
        async with http.post(url, json=chat("b", 2)) as resp:
            assert (await resp.json())["usage"]["completion_tokens"] == 2


async def test_a_profile_sets_the_iteration_times(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    path = tmp_path / "slow.json"
    flat_profile("slow", 0.03, 0.02).save(path)
    cfg = SimulatedConfig(
        model="fast,slow", token_scheduling=True, ttft_ms=1, itl_ms=1, profile=(f"slow={path}",)
    )
    async with SimulatedServer(cfg) as srv:
        url = srv.base_url + "/v1/chat/completions"
        t0 = time.monotonic()
        async with http.post(url, json=chat("slow", 5)) as resp:
            assert (await resp.json())["usage"]["completion_tokens"] == 5
        elapsed = time.monotonic() - t0
        async with http.post(url, json=chat("fast", 5)) as resp:
            assert resp.status == 200
        assert srv.scheduler is not None
        stats = srv.scheduler.executor.stats
    assert stats["slow"].busy_s == pytest.approx(0.03 + 4 * 0.02)  # from the profile
    assert stats["fast"].busy_s == pytest.approx(0.001 + 4 * 0.001)  # from --ttft-ms / --itl-ms
    assert elapsed >= 0.1


async def test_a_missing_profile_file_is_a_config_error(tmp_path: Path) -> None:
    cfg = SimulatedConfig(model="a,b", token_scheduling=True, profile=(f"a={tmp_path / 'none.json'}",))
    with pytest.raises(ConfigError, match="cannot read profile"):
        async with SimulatedServer(cfg):
            pass
