"""HTTP edges of a real ingress process: slow-header floods are cut off, hostile JSON answers 400, and join
tokens are written readable by their owner only."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from opentela.cli.localmesh import OTELA, LocalMesh
from slow_clients import idle_client, slow_header_client

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

HEADER_TIMEOUT = 2.0
KEEPALIVE_TIMEOUT = 4.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ingress(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """An ingress process with short connection deadlines."""
    env = {
        "OTELA_GATEWAY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "OTELA_GATEWAY_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT),
    }
    async with LocalMesh(tmp_path_factory.mktemp("http-edges")) as mesh:
        await mesh.start_ingress(env=env)
        yield mesh


def port_of(mesh: LocalMesh) -> int:
    return mesh.http_port


async def test_a_slow_header_flood_is_cut_off_and_the_ingress_keeps_serving(ingress: LocalMesh) -> None:
    port = port_of(ingress)
    flood = [asyncio.create_task(slow_header_client(port, 1.0, 30)) for _ in range(100)]
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as http:
        async with http.get(ingress.api + "/health") as r:
            assert r.status == 200  # served while the flood holds its connections
    closed = await asyncio.gather(*flood)
    assert all(t is not None for t in closed), f"{closed.count(None)} of 100 slow connections never closed"
    assert max(t for t in closed if t is not None) < HEADER_TIMEOUT + 4


async def test_idle_connections_are_closed_after_the_keepalive_timeout(ingress: LocalMesh) -> None:
    port = port_of(ingress)
    for after_request in (False, True):
        waited = await idle_client(port, 30, after_request=after_request)
        assert waited is not None, f"an idle connection was never closed (after a request: {after_request})"
        assert KEEPALIVE_TIMEOUT - 1 < waited < KEEPALIVE_TIMEOUT + 4


async def test_a_keepalive_client_is_served_across_requests(ingress: LocalMesh) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(ingress.api + "/health") as r:
                assert r.status == 200
            await asyncio.sleep(
                HEADER_TIMEOUT + 0.5
            )  # idle longer than the header deadline, within keep-alive


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 300 + b"]" * 300 + b"}]}",
        b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b', "messages": []}',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi", "x": -' + b"1" * 4301 + b"}]}",
    ],
    ids=["deep-array", "deep-messages", "300-deep-content", "5000-digit-int", "4301-digit-int"],
)
async def test_hostile_json_answers_400_at_the_ingress(ingress: LocalMesh, body: bytes) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            ingress.api + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            payload = await r.json()
            assert r.status == 400, payload
            assert payload["error"]["type"] == "invalid_request_error"
        async with http.get(ingress.api + "/health") as r:
            assert r.status == 200


def _otela(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OTELA, *args], capture_output=True, text=True, timeout=60, check=True)


async def test_join_tokens_are_written_0600_with_out(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, under which a shell redirect creates a 0644 file
    try:
        key = tmp_path / "network.key"
        _otela("network", "init", "--out", str(key))
        fresh, existing = tmp_path / "a.token", tmp_path / "b.token"
        existing.write_text("old\n")
        existing.chmod(0o644)
        for path in (fresh, existing):
            done = _otela("network", "issue", "--key", str(key), "--provider", "lab-a", "--out", str(path))
            assert done.stdout == ""  # the secret went to the file only
            assert path.stat().st_mode & 0o777 == 0o600
            token = path.read_text().strip()
            assert token.startswith("otjoin1_")
            assert '"provider_id": "lab-a"' in _otela("network", "show-token", token).stdout
        helptext = _otela("network", "issue", "--help").stdout
        assert "--out" in helptext and "0600" in helptext
    finally:
        os.umask(old)
