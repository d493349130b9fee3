"""A stream whose serving node is killed mid-response resumes on another replica, with real processes."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from opentela.cli.localmesh import OTELA, LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID

pytestmark = pytest.mark.integration

TOKENS = 40
KILL_AFTER = 10
"""Content events the client reads before the serving node is killed."""
ENGINE = [*OTELA, "engine", "simulated", "--model", "sim", "--itl-ms", "50"]
PROVIDERS = {"lab-a": "worker-a", "lab-b": "worker-b"}


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[LocalMesh]:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        for provider, name in PROVIDERS.items():
            await m.add_worker(name, ENGINE, provider=provider)
        await m.wait_serving("sim", 2, timeout=60)
        yield m


def body() -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "Count for me"}],
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream(
    mesh: LocalMesh,
    *,
    kill: bool,
    headers: dict[str, str] | None = None,
    request: dict[str, Any] | None = None,
    after: int = KILL_AFTER,
) -> list[Any]:
    """The events of one streamed chat; with `kill`, the serving node dies after `after` content events."""
    events: list[Any] = []
    payload = {**body(), **(request or {})}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=payload, headers=headers) as resp:
        assert resp.status == 200
        serving = PROVIDERS[resp.headers["X-Otela-Provider"]]
        content = 0
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
            if isinstance(events[-1], dict) and any(
                c["delta"].get("content") for c in events[-1].get("choices", [])
            ):
                content += 1
                if kill and content == after:
                    mesh.nodes[serving].signal(signal.SIGKILL, group=True)
    return events


def text_of(events: list[Any]) -> str:
    return "".join(
        c["delta"].get("content") or "" for e in events if isinstance(e, dict) for c in e.get("choices", [])
    )


async def test_a_stream_whose_node_is_killed_resumes_on_the_other_replica(mesh: LocalMesh) -> None:
    whole = await stream(mesh, kill=False)
    events = await asyncio.wait_for(stream(mesh, kill=True), timeout=30)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert not any("error" in e for e in chunks), chunks
    assert len({(e["id"], e["created"], e["model"]) for e in chunks}) == 1
    roles = [c["delta"].get("role") for e in chunks for c in e["choices"] if c["delta"].get("role")]
    assert roles == ["assistant"]
    assert text_of(chunks) == text_of(whole[:-1])  # the answer goes on where it broke off, nothing repeated
    assert chunks[-1]["usage"] == whole[-2]["usage"]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + TOKENS
    log = mesh.nodes["ingress"].log_text()
    assert "resumed stream" in log
    metrics = await (await mesh.http().get(mesh.api.removesuffix("/v1") + "/metrics")).text()
    assert "otela_stream_resumes_total" in metrics


async def test_a_stream_that_opted_out_ends_with_the_error_event(mesh: LocalMesh) -> None:
    events = await asyncio.wait_for(stream(mesh, kill=True, headers={"X-Otela-Resume": "off"}), timeout=30)
    assert "[DONE]" not in events
    assert "error" in events[-1] and events[-1]["error"]["code"] in ("engine_crashed", "connection_closed")
    assert len(text_of(events)) > 0


async def test_the_embedded_engine_continues_a_killed_stream(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as m:
        await m.start_ingress()
        for provider, name in PROVIDERS.items():
            await m.add_worker(name, embedded_engine_argv(threads=1), provider=provider)
        await m.wait_serving(MODEL_ID, 2, timeout=90)
        request = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": "Count from 1 to 100, one number per line."}],
            "max_tokens": 120,
            "temperature": 0,
        }
        events = await asyncio.wait_for(stream(m, kill=True, request=request, after=5), timeout=90)
        assert events[-1] == "[DONE]", events[-3:]
        chunks = events[:-1]
        assert not any("error" in e for e in chunks), chunks
        # llama.cpp stamps each chunk with its own time, so `created` may step within one stream.
        assert len({(e["id"], e["model"]) for e in chunks}) == 1
        roles = [c["delta"].get("role") for e in chunks for c in e["choices"] if c["delta"].get("role")]
        assert roles == ["assistant"]
        usage = chunks[-1]["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["completion_tokens"] >= sum(
            1 for e in chunks for c in e["choices"] if c["delta"].get("content")
        )
        assert "resumed stream" in m.nodes["ingress"].log_text()
