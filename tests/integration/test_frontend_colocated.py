"""`otela start --ingress --frontend`: the frontend hands requests to its node's gateway in-process, and the client
gets what the ingress itself would give (status, routing headers, body, stream events, errors), metered as usual."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from sqlalchemy import select

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess, free_port
from opentela.frontend.db import Database
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MODEL = "colocated-model"
ROUTING = ("X-Otela-Node", "X-Otela-Session", "X-Otela-Provider")


class Colocated:
    """An ingress node running the frontend, one worker, and a key."""

    def __init__(self, mesh: LocalMesh, node: NodeProcess, front: str, secret: str, db: Database) -> None:
        self.mesh, self.node, self.front, self.secret, self.db = mesh, node, front, secret, db
        self.ingress = mesh.api.removesuffix("/v1")

    async def post(
        self, base: str, body: dict[str, Any], **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        """POST a chat completion to `base` (the frontend with the key, or the ingress)."""
        if base == self.front:
            headers["Authorization"] = f"Bearer {self.secret}"
        async with self.mesh.http().post(base + "/v1/chat/completions", json=body, headers=headers) as r:
            return r.status, r.headers.copy(), await r.read()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def colocated(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Colocated]:
    tmp = tmp_path_factory.mktemp("colocated")
    url = f"sqlite:///{tmp / 'frontend.db'}"
    db = await Database.open(url)
    _, secret = await KeyStore(db).create(KeySettings(name="colocated", budget_tokens=10**6))
    port = free_port()
    async with LocalMesh(tmp) as mesh:
        node = await mesh.start_ingress("--frontend", "--db", url, "--frontend-http", f"127.0.0.1:{port}")
        engine = [
            *OTELA,
            "engine",
            "simulated",
            "--model",
            MODEL,
            "--port",
            str(free_port()),
            "--ttft-ms",
            "5",
        ]
        await mesh.add_worker("worker", [*engine, "--itl-ms", "2"], provider="colocated-lab")
        await mesh.wait_serving(MODEL, 1, timeout=60)
        front = f"http://127.0.0.1:{port}"
        await mesh.wait_for(lambda: _up(mesh, front), timeout=60, what="the frontend")
        try:
            yield Colocated(mesh, node, front, secret, db)
        finally:
            await db.aclose()


async def _up(mesh: LocalMesh, url: str) -> bool:
    try:
        async with mesh.http().get(url + "/api/info") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _row(db: Database, row_id: str) -> UsageRow:
    async with db.session() as s:
        row = await s.scalar(select(UsageRow).where(UsageRow.id == row_id))
    assert row is not None, f"no usage row {row_id}"
    return row


def _events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


async def test_the_frontend_runs_in_process_with_the_gateway(colocated: Colocated) -> None:
    """The start-up lines say so, and the frontend's requests are the gateway's own (its request counter moves)."""
    assert "requests go to this node's gateway in-process" in colocated.node.log_text()
    assert "limits decided in memory" in colocated.node.log_text()

    async def served() -> float:
        async with colocated.mesh.http().get(colocated.ingress + "/metrics") as r:
            text = await r.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("otela_requests_total{") and MODEL in line
        )

    before = await served()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, _, _ = await colocated.post(colocated.front, body)
    assert status == 200
    assert await served() == before + 1


async def test_a_plain_answer_is_the_ingress_answer_and_is_metered(colocated: Colocated) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
    f_status, f_headers, f_body = await colocated.post(
        colocated.front, body, **{"X-Request-Id": "colocated-1"}
    )
    i_status, i_headers, i_body = await colocated.post(colocated.ingress, body)
    assert f_status == i_status == 200
    assert {h: f_headers[h] for h in ROUTING} == {h: i_headers[h] for h in ROUTING}
    assert f_headers["X-Otela-Request-Id"] == "colocated-1"
    ours, theirs = json.loads(f_body), json.loads(i_body)
    assert ours.keys() == theirs.keys() and ours["usage"] == theirs["usage"]
    assert ours["choices"][0]["message"] == theirs["choices"][0]["message"]
    row = await _row(colocated.db, f_headers["X-Otela-Usage-Row"])
    assert row.status == "ok" and row.request_id == "colocated-1"
    assert (row.input_tokens, row.output_tokens) == (
        ours["usage"]["prompt_tokens"],
        ours["usage"]["completion_tokens"],
    )
    assert row.provider == "colocated-lab" and row.node == f_headers["X-Otela-Node"]


async def test_a_stream_is_the_ingress_stream_and_is_metered(colocated: Colocated) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    f_status, f_headers, f_raw = await colocated.post(colocated.front, body)
    i_status, i_headers, i_raw = await colocated.post(colocated.ingress, body)
    assert f_status == i_status == 200
    assert f_headers["Content-Type"].startswith("text/event-stream")
    assert {h: f_headers[h] for h in ROUTING} == {h: i_headers[h] for h in ROUTING}
    ours, theirs = _events(f_raw), _events(i_raw)
    assert ours[-1] == theirs[-1] == "[DONE]"

    def text(events: list[str]) -> str:
        chunks = [json.loads(e) for e in events[:-1]]
        return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])

    assert text(ours) == text(theirs) and len(ours) == len(theirs)
    usage = json.loads(ours[-2])["usage"]
    row = await _row(colocated.db, f_headers["X-Otela-Usage-Row"])
    assert row.status == "ok" and (row.input_tokens, row.output_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


async def test_errors_are_the_ingress_errors(colocated: Colocated) -> None:
    """A model nobody serves and an impossible output bound: the same status and OpenAI error as the ingress."""
    for body in (
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9},
    ):
        f_status, f_headers, f_body = await colocated.post(colocated.front, body)
        i_status, _, i_body = await colocated.post(colocated.ingress, body)
        assert f_status == i_status and f_status >= 400, (f_status, i_status, f_body)
        ours, theirs = json.loads(f_body)["error"], json.loads(i_body)["error"]
        assert (ours["code"], ours["type"], ours["message"]) == (
            theirs["code"],
            theirs["type"],
            theirs["message"],
        )
        row = await _row(colocated.db, f_headers["X-Otela-Usage-Row"])
        assert row.status == "error" and row.http_status == f_status
