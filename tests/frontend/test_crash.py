"""`otela frontend` killed with SIGKILL mid-request: no admitted or completed request lacks its usage row."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from frontend_helpers import FrontendProcess, counters
from sqlalchemy import select

from opentela.cli.localmesh import OTELA, LocalMesh, free_port
from opentela.engines.embedded import MODEL_ID
from opentela.frontend.db import Database
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
SIM_MODEL = "burst-model"


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }


async def _rows(db: Database) -> dict[str, UsageRow]:
    async with db.session() as s:
        return {r.id: r for r in (await s.scalars(select(UsageRow))).all()}


async def test_kill_mid_stream_leaves_a_row_that_restart_marks_interrupted(
    mesh: LocalMesh, db_url: str, tmp_path: Path
) -> None:
    db = await Database.open(db_url)
    _, secret = await KeyStore(db).create(KeySettings(name="crash"))
    fe = await FrontendProcess(mesh.api, db_url, tmp_path, name="crash-a").start()
    restarted = None
    try:
        body = {k: v for k, v in _body(400, True).items() if v is not None}
        headers = {"Authorization": f"Bearer {secret}"}
        async with aiohttp.ClientSession() as http:
            async with http.post(fe.url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                row_id = r.headers["X-Otela-Usage-Row"]
                while line := await r.content.readline():
                    if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                        "content"
                    ):
                        break
                fe.node.signal(signal.SIGKILL)
                with pytest.raises(aiohttp.ClientPayloadError):
                    while await r.content.readline():
                        pass
        await fe.node.wait(30)
        assert (await _rows(db))[row_id].status == "pending"  # written before the first byte was forwarded
        restarted = await FrontendProcess(mesh.api, db_url, tmp_path, name="crash-a").start()
        row = (await _rows(db))[row_id]
        assert row.status == "interrupted" and row.finished_at is not None
        assert row.input_tokens > 0 and row.tokens_estimated and "stopped" in (row.error or "")
    finally:
        await fe.stop()
        if restarted is not None:
            await restarted.stop()
        await db.aclose()


async def _one(http: aiohttp.ClientSession, url: str, secret: str, body: dict, done: asyncio.Event) -> dict:
    """Send one request; report what the client saw: the usage row id, whether it completed, its usage."""
    seen: dict[str, Any] = {"row": None, "complete": False, "usage": None}
    try:
        async with http.post(url, json=body, headers={"Authorization": f"Bearer {secret}"}) as r:
            seen["row"] = r.headers.get("X-Otela-Usage-Row")
            if not body["stream"]:
                payload = await r.json()
                seen["usage"], seen["complete"] = payload["usage"], r.status == 200
            else:
                async for line in r.content:
                    if line.startswith(b"data: {") and (usage := json.loads(line[6:]).get("usage")):
                        seen["usage"] = usage
                    if line.strip() == b"data: [DONE]":
                        seen["complete"] = True
    except (aiohttp.ClientError, json.JSONDecodeError):
        pass
    if seen["complete"]:
        done.set()
    return seen


async def test_kill_as_responses_complete_loses_no_usage(
    mesh: LocalMesh, db_url: str, tmp_path: Path
) -> None:
    """Requests of different lengths in flight; SIGKILL the moment the first one completes."""
    db = await Database.open(db_url)
    _, secret = await KeyStore(db).create(KeySettings(name="crash-b"))
    fe = await FrontendProcess(mesh.api, db_url, tmp_path, name="crash-b").start()
    restarted = None
    try:
        done = asyncio.Event()
        bodies = [
            {k: v for k, v in _body(n, i % 2 == 0).items() if v is not None}
            for i, n in enumerate((3, 4, 24, 48, 64, 96))
        ]
        async with aiohttp.ClientSession() as http:
            tasks = [
                asyncio.create_task(_one(http, fe.url + "/v1/chat/completions", secret, b, done))
                for b in bodies
            ]
            await asyncio.wait_for(done.wait(), 120)
            fe.node.signal(signal.SIGKILL)
            seen = await asyncio.gather(*tasks)
        await fe.node.wait(30)
        rows = await _rows(db)
        completed = [s for s in seen if s["complete"]]
        assert completed, "no request completed before the kill"
        for s in completed:
            row = rows[s["row"]]
            # The row was completed before the last byte went out: counts match what the client was told.
            assert row.status == "ok", (row.status, row.error)
            assert (row.input_tokens, row.output_tokens) == (
                s["usage"]["prompt_tokens"],
                s["usage"]["completion_tokens"],
            )
        for s in seen:
            if s["row"] is not None:
                assert s["row"] in rows  # every request the frontend admitted has its row
        restarted = await FrontendProcess(mesh.api, db_url, tmp_path, name="crash-b").start()
        after = await _rows(db)
        assert not [r for r in after.values() if r.status == "pending"]
        assert {r.status for r in after.values()} <= {"ok", "interrupted"}
    finally:
        await fe.stop()
        if restarted is not None:
            await restarted.stop()
        await db.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def sim_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """An ingress and a worker whose simulated engine takes 30 ms to the first token and 5 ms per token: a burst
    of requests is in flight together, each for a different time."""
    async with LocalMesh(tmp_path_factory.mktemp("burst-mesh")) as m:
        await m.start_ingress()
        engine = [*OTELA, "engine", "simulated", "--model", SIM_MODEL, "--port", str(free_port())]
        await m.add_worker("worker", [*engine, "--ttft-ms", "30", "--itl-ms", "5"])
        await m.wait_serving(SIM_MODEL, 1, timeout=60)
        yield m


async def test_kill_during_a_burst_of_200_loses_no_completed_row_and_no_counter_runs_ahead(
    sim_mesh: LocalMesh, db_url: str, tmp_path: Path
) -> None:
    """200 concurrent requests of a key with budgets, SIGKILL once 30 have completed (early: under load the client
    sees completions late, and at 60 the server had once finished all 200). Every response the client fully
    received has its completed row, and after the restart every budget counter equals its rows."""
    db = await Database.open(db_url)
    key, secret = await KeyStore(db).create(
        KeySettings(name="burst", budget_tokens=10**9, budget_requests=10**6, rpm_limit=10**6)
    )
    fe = await FrontendProcess(sim_mesh.api, db_url, tmp_path, name="burst").start()
    restarted = None
    try:
        enough, completed = asyncio.Event(), 0

        async def one(i: int) -> dict[str, Any]:
            nonlocal completed
            body = {
                "model": SIM_MODEL,
                "messages": [{"role": "user", "content": f"request {i}"}],
                "max_tokens": 1 + (i * 7) % 40,
                "stream": i % 2 == 0,
            }
            if body["stream"]:
                body["stream_options"] = {"include_usage": True}
            seen = await _one(http, fe.url + "/v1/chat/completions", secret, body, asyncio.Event())
            if seen["complete"]:
                completed += 1
                if completed >= 30:
                    enough.set()
            return seen

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            tasks = [asyncio.create_task(one(i)) for i in range(200)]
            await asyncio.wait_for(enough.wait(), 120)
            fe.node.signal(signal.SIGKILL)
            seen = await asyncio.gather(*tasks)
        await fe.node.wait(30)
        rows = await _rows(db)
        done = [s for s in seen if s["complete"]]
        assert 30 <= len(done) < 200, len(done)  # the kill came in the middle of the burst
        for s in done:
            row = rows[s["row"]]
            assert row.status == "ok", (row.status, row.error)
            assert (row.input_tokens, row.output_tokens) == (
                s["usage"]["prompt_tokens"],
                s["usage"]["completion_tokens"],
            )
        stored, truth = await counters(db)
        assert {k: v for k, v in stored.items() if k[0] == key.id} == {
            k: v for k, v in truth.items() if k[0] == key.id
        }
        restarted = await FrontendProcess(sim_mesh.api, db_url, tmp_path, name="burst").start()
        after = await _rows(db)
        assert not [r for r in after.values() if r.status == "pending"]
        stored, truth = await counters(db)
        mine = {k: v for k, v in stored.items() if k[0] == key.id}
        assert mine == {k: v for k, v in truth.items() if k[0] == key.id}
        assert mine and next(iter(mine.values()))[0] == len([r for r in after.values() if r.key_id == key.id])
    finally:
        await fe.stop()
        if restarted is not None:
            await restarted.stop()
        await db.aclose()
