"""The simulated engine speaks the OpenAI API on its timing model and injects the failures it is told to."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import math
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from opentela.engines.base import free_port
from opentela.engines.simulated import (
    CRASH_EXIT_CODE,
    OWNER,
    SimulatedConfig,
    SimulatedServer,
    embedding_vector,
)
from opentela.errors import ConfigError
from opentela.openai_edge import estimate_text_tokens

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "x" * 40}]}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, str]]:
    """Yield (arrival time, payload) for each `data:` line of an SSE response."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            yield time.monotonic(), line[len("data: ") :]


async def test_models_and_health_say_simulated(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(model="m1")) as srv:
        async with http.get(srv.base_url + "/v1/models") as resp:
            body = await resp.json()
        assert resp.status == 200
        assert body["data"] == [
            {
                "id": "m1",
                "object": "model",
                "created": body["data"][0]["created"],
                "owned_by": OWNER,
                "max_model_len": 32768,
                "otela": {"simulated": True},
            }
        ]
        async with http.get(srv.base_url + "/health") as resp:
            assert resp.status == 200


async def test_chat_non_stream_takes_ttft_plus_itl_and_reports_usage(http: aiohttp.ClientSession) -> None:
    cfg = SimulatedConfig(ttft_ms=40, itl_ms=10)
    async with SimulatedServer(cfg) as srv:
        t0 = time.monotonic()
        async with http.post(srv.base_url + "/v1/chat/completions", json={**CHAT, "max_tokens": 5}) as resp:
            body = await resp.json()
        elapsed = time.monotonic() - t0
    assert resp.status == 200
    assert 0.080 <= elapsed < 0.5  # 40 ms + 4 * 10 ms
    assert body["object"] == "chat.completion"
    assert body["model"] == "sim-model"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 5
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 10 + 4,
        "completion_tokens": 5,
        "total_tokens": 19,
    }  # 4 per message


async def test_default_max_tokens_applies(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=0, default_max_tokens=7)) as srv:
        async with http.post(srv.base_url + "/v1/completions", json={"prompt": "abcd" * 3}) as resp:
            body = await resp.json()
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 7
    assert body["usage"]["prompt_tokens"] == 3


async def test_chat_stream_chunks_are_spaced_by_itl_with_usage_and_done(http: aiohttp.ClientSession) -> None:
    cfg = SimulatedConfig(ttft_ms=30, itl_ms=25)
    body = {**CHAT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    async with SimulatedServer(cfg) as srv:
        t0 = time.monotonic()
        async with http.post(srv.base_url + "/v1/chat/completions", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            events = [e async for e in sse_events(resp)]
    payloads = [p for _, p in events]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(tokens) == 4
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    times = [t for t, p in events if p != "[DONE]"][:4]
    assert times[0] - t0 >= 0.025
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.018 <= g < 0.2 for g in gaps), gaps


async def test_completion_stream_without_usage(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=1, itl_ms=1)) as srv:
        req = {"prompt": "hi", "max_tokens": 3, "stream": True}
        async with http.post(srv.base_url + "/v1/completions", json=req) as resp:
            payloads = [p async for _, p in sse_events(resp)]
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert payloads[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in chunks).split() == ["lorem", "ipsum", "dolor"]
    assert all("usage" not in c for c in chunks)


async def test_queue_beyond_max_concurrency(http: aiohttp.ClientSession) -> None:
    cfg = SimulatedConfig(ttft_ms=60, itl_ms=0, max_concurrency=1)
    async with SimulatedServer(cfg) as srv:

        async def one() -> float:
            t0 = time.monotonic()
            async with http.post(srv.base_url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1}) as r:
                await r.read()
            return time.monotonic() - t0

        first, second = sorted(await asyncio.gather(one(), one()))
    assert first < 0.110
    assert second >= 0.115  # waited for the one slot, then its own TTFT


async def test_embeddings_are_deterministic_unit_vectors(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, embedding_dim=16)) as srv:
        req = {"model": "sim-model", "input": ["alpha", "beta", "alpha"]}
        async with http.post(srv.base_url + "/v1/embeddings", json=req) as resp:
            body = await resp.json()
        async with http.post(
            srv.base_url + "/v1/embeddings", json={**req, "encoding_format": "base64"}
        ) as r2:
            b64 = await r2.json()
    vecs = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert len(vecs[0]) == 16 and vecs[0] == vecs[2] and vecs[0] != vecs[1]
    assert math.isclose(sum(v * v for v in vecs[1]), 1.0, rel_tol=1e-9)
    assert vecs[0] == embedding_vector("alpha", 16, "sim-model")
    decoded = struct.unpack("<16f", base64.b64decode(b64["data"][1]["embedding"]))
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(decoded, vecs[1], strict=True))
    assert body["usage"]["prompt_tokens"] == 2 * estimate_text_tokens("alpha") + estimate_text_tokens("beta")


async def test_error_rate_one_answers_500_in_openai_shape(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, error_rate=1.0)) as srv:
        for path, req in (("/v1/chat/completions", CHAT), ("/v1/embeddings", {"input": "a"})):
            async with http.post(srv.base_url + path, json=req) as resp:
                body = await resp.json()
            assert resp.status == 500
            assert body["error"]["type"] == "server_error"


async def test_bad_requests_get_clear_errors(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0)) as srv:
        url = srv.base_url + "/v1/chat/completions"
        async with http.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and "JSON" in (await r.json())["error"]["message"]
        async with http.post(url, json={**CHAT, "model": "other"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        async with http.post(url, json={"model": "sim-model", "messages": []}) as r:
            assert r.status == 400
        async with http.post(url, json={**CHAT, "max_tokens": "lots"}) as r:
            assert r.status == 400
        assert srv.handlers is not None and srv.handlers.requests == 0  # rejected requests are not counted


async def test_hang_after_stops_answering_everything(http: aiohttp.ClientSession) -> None:
    short = aiohttp.ClientTimeout(total=0.3)
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=0, hang_after=1)) as srv:
        async with http.post(srv.base_url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(srv.base_url + "/v1/chat/completions", json=CHAT, timeout=short) as resp:
                await resp.read()
        with pytest.raises(asyncio.TimeoutError):
            async with http.get(srv.base_url + "/health", timeout=short) as resp:
                await resp.read()


async def test_in_process_crash_drops_connections(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=5, crash_after=0)) as srv:
        with pytest.raises(aiohttp.ClientError):
            req = {**CHAT, "max_tokens": 5, "stream": True}
            async with http.post(srv.base_url + "/v1/chat/completions", json=req) as resp:
                async for _ in resp.content:
                    pass
        assert srv.crashed
        with pytest.raises(aiohttp.ClientError):
            async with http.get(srv.base_url + "/v1/models") as resp:
                await resp.read()


async def test_openai_sdk_is_served() -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=1, itl_ms=1)) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
        try:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["sim-model"]
            chat = await client.chat.completions.create(
                model="sim-model", messages=CHAT["messages"], max_tokens=3
            )
            assert chat.usage is not None and chat.usage.completion_tokens == 3
            stream = await client.chat.completions.create(
                model="sim-model", messages=CHAT["messages"], max_tokens=3, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert text.split() == ["lorem", "ipsum", "dolor"]
            emb = await client.embeddings.create(model="sim-model", input="hello")
            assert emb.data[0].embedding == pytest.approx(
                embedding_vector("hello", 64, "sim-model"), abs=1e-6
            )
        finally:
            await client.close()


def test_crash_after_kills_the_process_mid_stream() -> None:
    port = free_port()
    code = "import sys; from opentela.engines.simulated import main; main(sys.argv[1:])"
    argv = [
        sys.executable,
        "-c",
        code,
        "--port",
        str(port),
        "--ttft-ms",
        "1",
        "--itl-ms",
        "20",
        "--crash-after",
        "1",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()

        async def drive() -> list[str]:
            got: list[str] = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                async with http.post(url, json={**CHAT, "max_tokens": 2}) as resp:
                    assert resp.status == 200
                with pytest.raises(aiohttp.ClientError):
                    async with http.post(url, json={**CHAT, "max_tokens": 10, "stream": True}) as resp:
                        async for _, payload in sse_events(resp):
                            got.append(payload)
            return got

        got = asyncio.run(drive())
        assert len(got) == 1 and json.loads(got[0])["choices"][0]["delta"]["content"]
        assert proc.wait(timeout=10) == CRASH_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    assert proc.stderr is not None


def test_config_round_trips_through_flags_and_validates() -> None:
    cfg = SimulatedConfig(model="m", ttft_ms=5.0, error_rate=0.25, crash_after=3)
    assert SimulatedConfig.from_argv(cfg.to_argv()) == cfg
    assert SimulatedConfig.from_argv([]) == SimulatedConfig()
    with pytest.raises(ConfigError):
        SimulatedConfig(error_rate=1.5)
    with pytest.raises(ConfigError):
        SimulatedConfig(max_concurrency=0)


def test_roofline_timing_for_a_declared_gpu() -> None:
    from opentela.engines.sim_timing import TimingModel, params_from_name

    assert params_from_name("llama-3.1-8b") == 8
    assert params_from_name("Qwen3-0.6B") == 0.6
    assert params_from_name("sim-model") is None
    h100 = TimingModel.roofline("H100", 8)
    a100 = TimingModel.roofline("NVIDIA A100-SXM4-80GB", 8)
    fp8 = TimingModel.roofline("H100", 8, "fp8")
    assert 0.003 < h100.itl(1) < 0.01  # 16 GB of weights over 3.35 TB/s
    assert a100.itl(1) > h100.itl(1) and fp8.itl(1) < h100.itl(1)
    assert h100.ttft(4000) > h100.ttft(100)  # prefill grows with the prompt
    cfg = SimulatedConfig(model="llama-3.1-8b", gpu="H100")
    assert cfg.timing() == h100
    settings = cfg.advertised_settings()
    assert settings["gpu"] == "H100" and settings["simulated"] is True and settings["throughput"] > 0
    with pytest.raises(ConfigError, match="unknown GPU"):
        SimulatedConfig(model="llama-3.1-8b", gpu="Z9000")
    with pytest.raises(ConfigError, match="params-b"):
        SimulatedConfig(model="sim-model", gpu="H100")


def test_error_kinds_parse_and_validate() -> None:
    cfg = SimulatedConfig(errors="503=0.25, disconnect=0.25", error_rate=0.1)
    assert cfg.error_rates() == {"500": 0.1, "503": 0.25, "disconnect": 0.25}
    for bad in ("404=0.1", "503", "503=2", "503=0.7,500=0.7"):
        with pytest.raises(ConfigError):
            SimulatedConfig(errors=bad)


async def test_injected_error_kinds(http: aiohttp.ClientSession) -> None:
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=0, errors="503=1.0")) as srv:
        async with http.post(srv.base_url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["code"] == "simulated_error"
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=0, errors="429=1.0")) as srv:
        async with http.post(srv.base_url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 429
    async with SimulatedServer(SimulatedConfig(ttft_ms=0, itl_ms=0, errors="disconnect=1.0")) as srv:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with http.post(srv.base_url + "/v1/chat/completions", json=CHAT) as resp:
                await resp.read()


def test_advertised_settings_from_a_models_entry() -> None:
    from opentela.engines.base import advertised_settings

    entry = {"id": "m", "max_model_len": 8192, "otela": {"gpu": "H100", "simulated": True, "bad": [1]}}
    assert advertised_settings(entry) == {"context_length": 8192, "gpu": "H100", "simulated": True}
    assert advertised_settings({"id": "m"}) == {}
    llama_cpp = {"id": "m", "owned_by": "llamacpp", "meta": {"n_ctx": 2048, "n_ctx_train": 8192}}
    assert advertised_settings(llama_cpp) == {"context_length": 2048}
    assert advertised_settings({"id": "m", "max_model_len": True, "meta": "x"}) == {}
