"""A model split over real block-server processes: exact tokens, the OpenAI front door, and failover by replay.

SmolLM2 runs as blocks 0-10, 10-20 and 20-30 on three node processes (plus a standby for 10-20), the ingress
drives the chain, and the reference is the same NumPy code run in this process (model/local.py), prefilling the
prompt in one chunk and then one token per step, as the chain client does.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio

from opentela.cli.localmesh import LocalMesh
from opentela.model.local import LocalPipeline
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.model.tokenizer import GGUFTokenizer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MODEL = SMOLLM2_ID
SPANS = {"blocks-a": (0, 10), "blocks-b": (10, 20), "blocks-c": (20, 30)}
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at",
    "import numpy as np\n",
    "The quick brown fox",
    "In 1969, astronauts",
    "A haiku about the sea:",
    "The largest planet in our solar system",
    "To make a cup of tea, first",
    "SELECT name FROM users WHERE",
    "The French word for cat is",
    "Photosynthesis is the process",
    "1, 2, 3, 5, 8, 13,",
    "My favourite book is",
    "The speed of light is",
    "Dear hiring manager,",
    "Rust and Python differ in",
    "The mitochondria is",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def reference() -> LocalPipeline:
    return LocalPipeline(str(default_model_path()), splits=[(0, 10), (10, 20), (20, 30)])


@pytest.fixture(scope="module")
def tokenizer() -> GGUFTokenizer:
    return GGUFTokenizer(str(default_model_path()))


async def _split_served(mesh: LocalMesh, servers: int) -> bool:
    listing = await mesh.get_json("/models") or {"data": []}
    entry = next((m for m in listing["data"] if m["id"] == MODEL), None)
    return entry is not None and entry.get("split") and len(entry["block_servers"]) >= servers


async def start_split_mesh(tmp_path: Path, spans: dict[str, tuple[int, int]], *extra: str) -> LocalMesh:
    mesh = LocalMesh(tmp_path)
    await mesh.__aenter__()
    await mesh.start_ingress(*extra)
    for name, (first, end) in spans.items():
        await mesh.add_worker(name, None, "--blocks", f"{MODEL}:{first}-{end}")
    await mesh.wait_for(
        lambda: _split_served(mesh, len(spans)), timeout=90, what="the split model at the ingress"
    )
    return mesh


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def split_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    mesh = await start_split_mesh(tmp_path_factory.mktemp("split"), SPANS)
    try:
        yield mesh
    finally:
        await mesh.aclose()


async def reference_tokens(reference: LocalPipeline, tokenizer: GGUFTokenizer, prompt: str) -> list[int]:
    """The one-process pipeline's greedy tokens for `prompt`, up to (not including) an end token."""
    tokens = await asyncio.to_thread(reference.generate, tokenizer.encode(prompt), NEW_TOKENS)
    stops = set(tokenizer.stop_token_ids)
    return tokens[: next((i for i, t in enumerate(tokens) if t in stops), len(tokens))]


def client(mesh: LocalMesh) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=mesh.api, api_key="unused", max_retries=0, timeout=120)


async def test_split_model_is_listed_with_its_block_servers(split_mesh: LocalMesh) -> None:
    async with client(split_mesh) as sdk:
        models = await sdk.models.list()
    entry = next(m for m in models.data if m.id == MODEL)
    servers = entry.model_extra["block_servers"]
    assert sorted(tuple(s["blocks"][0]) for s in servers) == sorted(SPANS.values())
    assert all(s["total_blocks"] == 30 and s["block_ms"] > 0 for s in servers)


@pytest.mark.timeout(300)
async def test_greedy_tokens_equal_the_one_process_pipeline(
    split_mesh: LocalMesh, reference: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    """20 prompts x 64 new tokens over three processes, token for token the same as the NumPy code in one."""

    async def one(prompt: str) -> tuple[str, int]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
        async with split_mesh.http().post(f"{split_mesh.api}/completions", json=body) as resp:
            answer = json.loads(await resp.read())
            assert resp.status == 200, answer
            assert resp.headers["X-Otela-Chain"].count(",") == 2
        return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]

    async def all_references() -> list[list[int]]:
        return [await reference_tokens(reference, tokenizer, p) for p in PROMPTS]

    # The reference runs in a thread meanwhile (NumPy lets go of the GIL): the two take turns on the CPUs
    # instead of one waiting for the other.
    references = asyncio.create_task(all_references())
    # Four at a time: the servers pipeline different sessions' steps without starving the 2-core machine.
    served = []
    for group in range(0, len(PROMPTS), 4):
        served += await asyncio.gather(*(one(p) for p in PROMPTS[group : group + 4]))
    for prompt, (text, count), expected in zip(PROMPTS, served, await references, strict=True):
        assert count == len(expected), prompt
        assert text == tokenizer.decode(expected), prompt


async def test_chat_streams_through_the_sdk(split_mesh: LocalMesh) -> None:
    async with client(split_mesh) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 16
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


async def test_bad_input_gets_an_openai_error(split_mesh: LocalMesh) -> None:
    async with client(split_mesh) as sdk:
        with pytest.raises(openai.BadRequestError) as too_long:
            await sdk.completions.create(model=MODEL, prompt="hello", max_tokens=10_000_000)
        with pytest.raises(openai.BadRequestError) as n_two:
            await sdk.completions.create(model=MODEL, prompt="hello", max_tokens=4, n=2)
        with pytest.raises(openai.BadRequestError):
            await sdk.embeddings.create(model=MODEL, input="hello")
        ok = await sdk.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    assert "max_tokens" in str(too_long.value) and "n" in str(n_two.value)
    assert ok.usage is not None and ok.usage.completion_tokens <= 2


async def _peer_names(mesh: LocalMesh) -> dict[str, str]:
    table = await mesh.get_json("/dnt/table") or []
    return {r["peer_id"][-6:]: r["provider_id"] for r in table if r["lifecycle"] in ("JOIN", "SERVING")}


async def _kill_mid_stream(
    tmp_path: Path, forwarding: str, reference: LocalPipeline, tokenizer: GGUFTokenizer
) -> tuple[str, str, list[Any]]:
    """Stream 64 tokens, SIGKILL the chain's 10-20 server after a few; the text and the killed node's name."""
    spans = {**SPANS, "blocks-b2": (10, 20)}
    env_flag = ("--config", str(tmp_path / "ingress.toml"))
    (tmp_path / "ingress.toml").write_text(f'[gateway]\nsplit_forwarding = "{forwarding}"\n')
    mesh = await start_split_mesh(tmp_path, spans, *env_flag)
    try:
        prompt = "Once upon a time, in a small village,"
        body = {"model": MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True}
        names = await _peer_names(mesh)
        pieces: list[str] = []
        events: list[Any] = []
        killed = ""
        async with mesh.http().post(f"{mesh.api}/completions", json=body) as resp:
            assert resp.status == 200
            chain = resp.headers["X-Otela-Chain"].split(",")
            middle = next(h for h in chain if h.endswith("[10:20)"))
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                events.append(event)
                if "error" in event:
                    continue
                pieces.append(event["choices"][0]["text"])
                if len(pieces) == 5 and not killed:
                    killed = names[middle.split("[")[0]]
                    mesh.nodes[killed].signal(signal.SIGKILL)
        expected = await reference_tokens(reference, tokenizer, prompt)
        return "".join(pieces), tokenizer.decode(expected), [killed, events]
    finally:
        await mesh.aclose()


@pytest.mark.parametrize("forwarding", ["client", "server"])
async def test_sigkill_of_a_block_server_mid_stream_is_invisible(
    tmp_path: Path, forwarding: str, reference: LocalPipeline, tokenizer: GGUFTokenizer
) -> None:
    text, expected, (killed, events) = await _kill_mid_stream(tmp_path, forwarding, reference, tokenizer)
    assert killed in ("blocks-b", "blocks-b2")
    assert not [e for e in events if "error" in e]
    assert text == expected
