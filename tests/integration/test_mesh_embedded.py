"""End to end through a real mesh: openai SDK -> ingress -> fabric -> worker -> SmolLM2, and the error contract."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from opentela.cli.localmesh import LocalMesh
from opentela.engines.embedded import MODEL_ID

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def client(mesh: LocalMesh) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=mesh.api, api_key="unused", max_retries=0, timeout=60)


async def test_sdk_lists_the_model_with_both_replicas(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:
        models = await sdk.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL_ID]
    replicas = models.data[0].model_extra["replicas"]
    assert {r["provider_id"] for r in replicas} == {"lab-a", "lab-b"}
    assert all(r["state"] == "SERVING" and r["engine"] == "embedded" for r in replicas)
    assert all(r["hardware"]["cpu_threads"] for r in replicas)


async def test_chat_completion_gets_a_real_answer(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
            max_tokens=24,
            temperature=0,
        )
    reply = raw.parse()
    assert "paris" in reply.choices[0].message.content.lower()
    assert reply.usage.completion_tokens > 0
    assert raw.headers["x-otela-request-id"]
    assert raw.headers["x-otela-node"].startswith("12D3KooW")


async def test_streaming_chat_arrives_in_chunks(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "Count from one to five."}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    usage = next(c.usage for c in chunks if c.usage)
    # One SSE event per generated token, relayed as it came: as many content chunks as tokens.
    assert usage.completion_tokens >= 3
    assert len(pieces) >= usage.completion_tokens - 1, (pieces, usage)
    assert "".join(pieces).strip()


async def test_completions_route_is_forwarded(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:
        out = await sdk.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8)
    assert out.choices[0].text


async def test_requests_spread_over_both_nodes(embedded_mesh: LocalMesh) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    http = embedded_mesh.http()

    async def one() -> str:
        async with http.post(f"{embedded_mesh.api}/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            return resp.headers["X-Otela-Node"]

    nodes = [await one() for _ in range(24)]
    counts = {n: nodes.count(n) for n in set(nodes)}
    # Uniform random over two replicas: both get some of 24 requests (all on one has probability 2**-23).
    assert len(counts) == 2, counts


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"messages": []}).encode(), 400, "model"),
        (json.dumps({"model": "no-such-model", "messages": []}).encode(), 404, MODEL_ID),
        (
            json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "x" * 70_000}]}).encode(),
            413,
            "",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(
    embedded_mesh: LocalMesh, body: bytes, status: int, needle: str
) -> None:
    async with embedded_mesh.http().post(
        f"{embedded_mesh.api}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        payload = await resp.json()
        assert resp.status == status, payload
        assert set(payload["error"]) >= {"message", "type", "code"}
        assert needle in payload["error"]["message"]
        assert resp.headers["X-Otela-Request-Id"]


async def test_max_tokens_past_the_context_window_is_refused_at_the_door(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:
        models = await sdk.models.list()
        windows = {r["settings"].get("context_length") for r in models.data[0].model_extra["replicas"]}
        assert windows == {2048}  # llama.cpp's slot window, as the engine reports it
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=10**12
            )
        assert refused.value.body["param"] == "max_tokens" and "at most 2048" in refused.value.body["message"]
        reply = await sdk.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=2
        )
        assert reply.usage.completion_tokens <= 2


async def test_unknown_route_and_method_are_openai_errors(embedded_mesh: LocalMesh) -> None:
    http = embedded_mesh.http()
    async with http.get(f"{embedded_mesh.api}/nope") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"
    async with http.get(f"{embedded_mesh.api}/chat/completions") as resp:
        assert resp.status == 405
        assert (await resp.json())["error"]["code"] == "method_not_allowed"


async def test_client_request_id_travels_end_to_end(embedded_mesh: LocalMesh) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    async with embedded_mesh.http().post(
        f"{embedded_mesh.api}/chat/completions", json=body, headers={"X-Request-Id": "trace-abc.123"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["X-Otela-Request-Id"] == "trace-abc.123"


async def test_infrastructure_endpoints_are_read_only_views(embedded_mesh: LocalMesh) -> None:
    http = embedded_mesh.http()
    base = embedded_mesh.api.removesuffix("/v1")
    table = await embedded_mesh.get_json("/dnt/table")
    assert {r["lifecycle"] for r in table} == {"JOIN", "SERVING"}  # the ingress itself has no engine
    assert sum(r["lifecycle"] == "SERVING" for r in table) == 2
    peers = await embedded_mesh.get_json("/dnt/peers")
    assert len([p for p in peers if not p.get("suspected")]) >= 2
    boots = await embedded_mesh.get_json("/dnt/bootstraps")
    assert boots["self"][0].split("@")[0].startswith("12D3KooW")
    stats = await embedded_mesh.get_json("/dnt/stats")
    assert stats["registry"] and stats["gossip"]
    health = await embedded_mesh.get_json("/health")
    assert health["status"] == "ok"
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    assert "otela_requests_total" in text and f'model="{MODEL_ID}"' in text
    for path in ("/v1/dnt/table", "/v1/models"):
        async with http.post(f"{base}{path}", json={}) as resp:
            assert resp.status == 405


async def test_concurrent_streams_all_complete(embedded_mesh: LocalMesh) -> None:
    async with client(embedded_mesh) as sdk:

        async def one(i: int) -> str:
            stream = await sdk.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": f"Say {i}"}], max_tokens=6, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        answers = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(answers)


async def test_client_disconnect_mid_stream_leaves_mesh_healthy(embedded_mesh: LocalMesh) -> None:
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 200,
        "stream": True,
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{embedded_mesh.api}/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readline()
        # leaving the block closes the connection mid-stream
    async with client(embedded_mesh) as sdk:
        out = await sdk.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert out.choices[0].message.content is not None


async def test_status_command_prints_the_mesh(embedded_mesh: LocalMesh) -> None:
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opentela",
        "status",
        "--ingress",
        embedded_mesh.api.removesuffix("/v1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "lab-a" in text and "lab-b" in text and "SERVING" in text and MODEL_ID in text


async def test_llama_cpp_errors_and_ignored_tools_reach_the_sdk_as_openai_errors(
    embedded_mesh: LocalMesh,
) -> None:
    async with client(embedded_mesh) as sdk:
        # A prompt past the 2,048-token slot: llama.cpp's own error, in OpenAI's shape.
        with pytest.raises(openai.BadRequestError) as overflow:
            await sdk.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "hello " * 3000}], max_tokens=4
            )
        assert overflow.value.code == "context_length_exceeded" and overflow.value.param == "messages"
        assert overflow.value.type == "invalid_request_error"
        # SmolLM2's chat template has no tools: llama.cpp would ignore them, so the ingress says so.
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        with pytest.raises(openai.BadRequestError) as tools:
            await sdk.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "user", "content": "Weather?"}],
                tools=[weather],
                max_tokens=4,
            )
        assert tools.value.param == "tools"
        reply = await sdk.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.headers["x-request-id"] == reply.headers["x-otela-request-id"]
