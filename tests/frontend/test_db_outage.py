"""The usage database goes away: requests get 503 with Retry-After and nothing reaches the ingress unmetered;
service resumes by itself when the database is back (real PostgreSQL, connections refused then allowed)."""

from __future__ import annotations

import subprocess

import aiohttp
from frontend_helpers import start_frontend
from frontend_services import PostgresServer

from opentela.frontend.keys import KeySettings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _sql(pg: PostgresServer, statement: str) -> None:
    argv = [str(pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user, "-d", "postgres"]
    subprocess.run(
        [*argv, "-v", "ON_ERROR_STOP=1", "-c", statement], check=True, capture_output=True, timeout=60
    )


async def test_database_outage_is_503_and_recovers(postgres: PostgresServer, recording_ingress) -> None:
    name = "outage_" + __import__("uuid").uuid4().hex[:8]
    url = postgres.create_database(name)
    fe = await start_frontend(recording_ingress[0], url)
    try:
        _, secret = await fe.state.keys.create(KeySettings(name="outage"))
        headers = {"Authorization": f"Bearer {secret}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
            _sql(postgres, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            _sql(postgres, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
            async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                payload = await r.json()
                assert r.status == 503 and payload["error"]["code"] == "database_unavailable", payload
                assert int(r.headers["Retry-After"]) >= 1
            assert len(recording_ingress[1]) == 1  # the refused request went nowhere
            _sql(postgres, f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            async with http.post(fe.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
        assert len(recording_ingress[1]) == 2
    finally:
        await fe.aclose()
