"""Forwarding while admission is decided through the database: a request the database refuses after all is
cancelled before any of its answer reaches anyone and leaves no usage row, and a key near its limit is admitted
before anything is sent (real PostgreSQL, two frontend replicas on one database, a stand-in ingress)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio
from aiohttp import web
from frontend_helpers import start_frontend
from frontend_services import PostgresServer
from sqlalchemy import func, select

from loopback_http import serve_app
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow

QUICK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SLOW = {**QUICK, "user": "slow"}


@pytest_asyncio.fixture
async def streaming_ingress() -> AsyncIterator[tuple[str, list[str], asyncio.Event]]:
    """A stand-in ingress: a quick JSON answer, or (user "slow") a 5 s stream that records whether its reader
    left: the events are `start`, then `gone` (also set as an asyncio event) or `finished`."""
    events: list[str] = []
    gone = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("user") != "slow":
            reply = {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": {}}
            return web.json_response(reply)
        events.append("start")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(100):
                await resp.write(b": working\n\n")
                await asyncio.sleep(0.05)
        except (ConnectionResetError, asyncio.CancelledError):
            events.append("gone")
            gone.set()
            raise
        events.append("finished")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serve_app(app, shutdown_timeout=1) as url:
        yield url, events, gone


async def test_a_request_refused_after_its_early_forward_is_cancelled_and_unmetered(
    postgres: PostgresServer, streaming_ingress: tuple[str, list[str], asyncio.Event]
) -> None:
    url = postgres.create_database(f"early_{uuid.uuid4().hex[:8]}")
    ingress, events, gone = streaming_ingress
    a = await start_frontend(ingress, url)
    b = await start_frontend(ingress, url)
    try:
        _, secret = await a.state.keys.create(
            KeySettings(name="ten", budget_requests=10, budget_period="day")
        )
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
            for _ in range(10):  # the whole budget, through replica a
                async with http.post(a.url + "/v1/chat/completions", json=QUICK) as r:
                    assert r.status == 200
            # Replica b has never seen the key: it sends the request on while the database decides.
            started = time.monotonic()
            async with http.post(b.url + "/v1/chat/completions", json=SLOW) as r:
                payload = await r.json()
                assert r.status == 402 and payload["error"]["code"] == "budget_exceeded", payload
            await asyncio.wait_for(gone.wait(), 3)
            assert events == ["start", "gone"]  # begun early, then dropped: never finished, never relayed
            assert time.monotonic() - started < 3
            # Refused once, the key is admitted before anything is sent: the ingress hears nothing more.
            async with http.post(b.url + "/v1/chat/completions", json=SLOW) as r:
                assert r.status == 402
            await asyncio.sleep(0.2)
            assert events == ["start", "gone"]
        async with a.state.db.session() as s:
            assert await s.scalar(select(func.count()).select_from(UsageRow)) == 10
    finally:
        await a.aclose()
        await b.aclose()


async def test_without_early_forwarding_a_refused_request_reaches_nothing(
    postgres: PostgresServer, streaming_ingress: tuple[str, list[str], asyncio.Event]
) -> None:
    url = postgres.create_database(f"late_{uuid.uuid4().hex[:8]}")
    ingress, events, _ = streaming_ingress
    a = await start_frontend(ingress, url)
    b = await start_frontend(ingress, url, forward_early=False)
    try:
        _, secret = await a.state.keys.create(
            KeySettings(name="ten", budget_requests=10, budget_period="day")
        )
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
            for _ in range(10):
                async with http.post(a.url + "/v1/chat/completions", json=QUICK) as r:
                    assert r.status == 200
            async with http.post(b.url + "/v1/chat/completions", json=SLOW) as r:
                assert r.status == 402
        await asyncio.sleep(0.2)
        assert events == []
    finally:
        await a.aclose()
        await b.aclose()
