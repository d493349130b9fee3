"""Trace details written after each answer, on SQLite and PostgreSQL: the prompt's prefix hashes (never its text,
never for keys that opted out), whether the answer reasoned, and both in the export."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from frontend_helpers import start_frontend
from sqlalchemy import select, text

from loopback_http import serve_app
from opentela.bench.traces import read_trace
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.prefix_hashes import (
    BYTES_PER_BLOCK,
    CHAT_PATH,
    COMPLETIONS_PATH,
    prompt_hashes,
    render_chat,
    salt_key,
    unpack,
)
from opentela.frontend.schema import UsageRow
from opentela.frontend.token_counts import ReasoningSeen
from opentela.frontend.trace_recorder import shipped_tokenizer, trace_salt
from opentela.model.locate import SMOLLM2_ID

ANSWER = "Paris is the capital."
THOUGHT = "The user asks about France."


def _chunks(reasoner: bool) -> list[dict[str, Any]]:
    first = [{"choices": [{"index": 0, "delta": {"reasoning_content": THOUGHT}}]}] if reasoner else []
    return [
        *first,
        {"choices": [{"index": 0, "delta": {"content": ANSWER}}]},
        {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 6}},
    ]


@pytest_asyncio.fixture
async def ingress() -> AsyncIterator[str]:
    """An ingress stand-in: chat answers (the model `reasoner` reasons first), completions and embeddings."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        reasoner = body["model"] == "reasoner"
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for chunk in _chunks(reasoner):
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        message = {
            "role": "assistant",
            "content": ANSWER,
            **({"reasoning_content": THOUGHT} if reasoner else {}),
        }
        usage = {"prompt_tokens": 40, "completion_tokens": 6}
        return web.json_response({"choices": [{"index": 0, "message": message}], "usage": usage})

    async def completions(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"index": 0, "text": ANSWER}], "usage": {"prompt_tokens": 4}})

    async def embeddings(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 2}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    async with serve_app(app) as url:
        yield url


async def _post(fe: Frontend, secret: str, path: str, body: dict[str, Any]) -> str:
    """Send a request through the frontend, read the whole answer; the id of its usage row."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        async with http.post(fe.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
            return r.headers["X-Otela-Usage-Row"]


async def _rows(fe: Frontend, *ids: str) -> list[UsageRow]:
    await fe.state.trace.flush()
    async with fe.state.db.session() as s:
        found = {r.id: r for r in (await s.scalars(select(UsageRow).where(UsageRow.id.in_(ids)))).all()}
    return [found[i] for i in ids]


async def _everything_stored(fe: Frontend) -> str:
    """Every row of every table of the frontend as text, and on SQLite the bytes of its files too."""
    out = []
    async with fe.state.db.engine.connect() as conn:
        for table in ("usage", "api_keys", "usage_counters", "usage_rate", "frontend_settings"):
            out.append(repr((await conn.execute(text(f"SELECT * FROM {table}"))).all()))
    database = fe.state.db.engine.url.database
    if fe.state.db.dialect == "sqlite" and database:
        out.append(await asyncio.to_thread(_sqlite_files, database))
    return "\n".join(out)


def _sqlite_files(database: str) -> str:
    """The bytes of a SQLite database and its write-ahead log, as text."""
    files = [Path(database + suffix) for suffix in ("", "-wal")]
    return "\n".join(f.read_bytes().decode("latin-1") for f in files if f.exists())


def _chat(model: str, system: str, question: str, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": 8, "stream": stream}


async def test_prompts_are_hashed_after_the_answer_and_their_text_is_never_stored(
    ingress: str, db_url: str
) -> None:
    fe = await start_frontend(ingress, db_url)
    try:
        _, open_secret = await fe.state.keys.create(KeySettings(name="traced"))
        _, private_secret = await fe.state.keys.create(KeySettings(name="private", log_content=False))
        system = "You help the Zanzibar-Quokka survey with geography questions. " * 4
        first = _chat("m-chat", system, "What is the capital of France?")
        second = _chat("m-chat", system, "Which river crosses Vienna?", stream=True)
        ids = [
            await _post(fe, open_secret, CHAT_PATH, first),
            await _post(fe, open_secret, CHAT_PATH, second),
            await _post(fe, private_secret, CHAT_PATH, first),
            await _post(
                fe, open_secret, COMPLETIONS_PATH, {"model": "m-text", "prompt": "Zanzibar-Quokka once"}
            ),
            await _post(fe, open_secret, "/v1/embeddings", {"model": "m-embed", "input": "Zanzibar-Quokka"}),
        ]
        rows = await _rows(fe, *ids)
        key = salt_key(await trace_salt(fe.state.db))
        # No tokenizer for these models: 64-byte chunks of the rendered prompt.
        assert unpack(rows[0].prefix_hashes) == prompt_hashes(CHAT_PATH, first, key, None)
        a, b = unpack(rows[0].prefix_hashes), unpack(rows[1].prefix_hashes)
        rendered = render_chat(first["messages"]), render_chat(second["messages"])
        common = next(i for i, (x, y) in enumerate(zip(*rendered, strict=False)) if x != y)
        shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        assert shared == common // BYTES_PER_BLOCK > 0
        completion = prompt_hashes(COMPLETIONS_PATH, {"prompt": "Zanzibar-Quokka once"}, key, None)
        assert completion and unpack(rows[3].prefix_hashes) == completion
        # A key that opted out has no hashes at all; an embedding has no prompt to hash.
        assert rows[2].prefix_hashes is None and rows[2].sampling is None
        assert rows[4].prefix_hashes is None
        assert [r.reasoning for r in rows] == [False, False, False, False, None]
        stored = await _everything_stored(fe)
        for fragment in ("Zanzibar", "Quokka", "capital of France", "Vienna", "Paris", "France"):
            assert fragment not in stored
    finally:
        await fe.aclose()


async def test_the_export_carries_the_hashes_and_the_salt_outlives_a_restart(
    ingress: str, db_url: str, tmp_path: Path
) -> None:
    fe = await start_frontend(ingress, db_url)
    try:
        _, secret = await fe.state.keys.create(KeySettings(name="traced"))
        system = "Think step by step about the puzzle. " * 3
        ids = [
            await _post(fe, secret, CHAT_PATH, _chat("reasoner", system, "What is 2 + 2?")),
            await _post(fe, secret, CHAT_PATH, _chat("reasoner", system, "What is 3 + 3?", stream=True)),
            await _post(fe, secret, CHAT_PATH, _chat("m-chat", system, "What is 4 + 4?", stream=True)),
        ]
        rows = await _rows(fe, *ids)
        assert [r.reasoning for r in rows] == [True, True, False]
        path = tmp_path / "trace.csv"
        path.write_text("".join([part async for part in fe.state.ledger.export_trace()]))
        records = read_trace(path)
        assert [r.prefix_hashes for r in records] == [unpack(r.prefix_hashes) for r in rows]
        assert [r.reasoning for r in records] == [True, True, False]
        assert all(len(r.prefix_hashes) >= 2 for r in records)
    finally:
        await fe.aclose()
    # A restart (or another replica on the database) keeps the salt: the same prompt hashes the same.
    again = await start_frontend(ingress, db_url)
    try:
        _, secret = await again.state.keys.create(KeySettings(name="traced-again"))
        (row,) = await _rows(
            again, await _post(again, secret, CHAT_PATH, _chat("reasoner", system, "What is 2 + 2?"))
        )
        assert row.prefix_hashes == rows[0].prefix_hashes
    finally:
        await again.aclose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_configured_salt_is_used_and_never_stored_and_hashing_can_be_off(
    ingress: str, db_url: str
) -> None:
    body = _chat("m-chat", "You are terse. " * 10, "Hello?")
    fe = await start_frontend(ingress, db_url, trace_salt="operator-salt")
    try:
        _, secret = await fe.state.keys.create(KeySettings(name="traced"))
        (row,) = await _rows(fe, await _post(fe, secret, CHAT_PATH, body))
        assert unpack(row.prefix_hashes) == prompt_hashes(CHAT_PATH, body, salt_key("operator-salt"), None)
        assert "operator-salt" not in await _everything_stored(fe)
    finally:
        await fe.aclose()
    off = await start_frontend(ingress, db_url, prefix_hashes="off")
    try:
        _, secret = await off.state.keys.create(KeySettings(name="untraced"))
        (row,) = await _rows(off, await _post(off, secret, CHAT_PATH, {**body, "model": "reasoner"}))
        assert row.prefix_hashes is None and row.reasoning is True
    finally:
        await off.aclose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_smollm2_requests_are_hashed_with_its_tokenizer(ingress: str, db_url: str) -> None:
    tokenizer = shipped_tokenizer(SMOLLM2_ID)
    if tokenizer is None:
        pytest.skip("the SmolLM2 GGUF is not installed")
    fe = await start_frontend(ingress, db_url)
    try:
        _, secret = await fe.state.keys.create(KeySettings(name="traced"))
        body = _chat(SMOLLM2_ID, "You are a helpful assistant. " * 5, "Hi there")
        (row,) = await _rows(fe, await _post(fe, secret, CHAT_PATH, body))
        key = salt_key(await trace_salt(fe.state.db))
        expected = prompt_hashes(CHAT_PATH, body, key, tokenizer)
        assert expected and unpack(row.prefix_hashes) == expected
        assert expected != prompt_hashes(CHAT_PATH, body, key, None)  # tokens, not byte chunks
    finally:
        await fe.aclose()


def test_reasoning_is_read_from_reasoning_text_or_a_leading_think_tag() -> None:
    def seen(*payloads: Any) -> bool | None:
        watch = ReasoningSeen()
        for payload in payloads:
            watch.feed(payload)
        return watch.value

    def delta(**fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": fields}]}

    assert seen(delta(role="assistant"), delta(reasoning_content="Hmm."), delta(content="4")) is True
    assert seen(delta(reasoning="Hmm."), delta(content="4")) is True  # the field's other name
    assert seen(delta(content="\n"), delta(content="<think>Hmm.</think>"), delta(content="4")) is True
    assert seen(delta(content="4"), delta(content=" <think> is a tag")) is False  # only a leading tag counts
    assert seen(delta(role="assistant"), {"choices": [], "usage": {"prompt_tokens": 3}}) is None
    assert seen({"choices": [{"message": {"content": "4", "reasoning_content": "Hmm."}}]}) is True
    assert seen({"choices": [{"text": "Once upon a time"}]}) is False
    assert seen("not a payload") is None
