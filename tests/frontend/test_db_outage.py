"""The usage database goes away: requests get 503 with Retry-After and nothing is answered unmetered;
service resumes by itself when the database is back (real PostgreSQL, connections refused then allowed)."""

from __future__ import annotations

import subprocess

import aiohttp
import pytest
from frontend_helpers import start_frontend
from frontend_services import PostgresServer

from opentela.frontend.keys import KeySettings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _sql(pg: PostgresServer, statement: str) -> None:
    argv = [str(pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user, "-d", "postgres"]
    subprocess.run(
        [*argv, "-v", "ON_ERROR_STOP=1", "-c", statement], check=True, capture_output=True, timeout=60
    )


@pytest.mark.parametrize("forward_early", [False, True], ids=["admit-first", "forward-early"])
async def test_database_outage_is_503_and_recovers(
    postgres: PostgresServer, recording_ingress, forward_early: bool
) -> None:
    """Admitting first, a request refused for the outage reaches nothing; forwarding early, the first one may have
    been sent on (and is dropped unanswered), after which nothing is sent early until the database is back."""
    name = "outage_" + __import__("uuid").uuid4().hex[:8]
    url = postgres.create_database(name)
    fe = await start_frontend(recording_ingress[0], url, forward_early=forward_early)
    try:
        _, secret = await fe.state.keys.create(KeySettings(name="outage"))
        headers = {"Authorization": f"Bearer {secret}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
            _sql(postgres, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            _sql(postgres, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
            for _ in range(3):
                async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                    payload = await r.json()
                    assert r.status == 503 and payload["error"]["code"] == "database_unavailable", payload
                    assert int(r.headers["Retry-After"]) >= 1
            sent_on = len(recording_ingress[1]) - 1
            assert sent_on == 0 if not forward_early else sent_on <= 1
            _sql(postgres, f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
        assert len(recording_ingress[1]) == 2 + sent_on
    finally:
        await fe.aclose()
