"""Model aliases end to end: a second ingress with an alias table joins the session's mesh (no engine of its own),
and a frontend in front of it routes, lists, retrieves and meters alias requests as the served model, refuses a
retired alias in OpenAI's format and suggests close names."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import pytest_asyncio
from frontend_helpers import start_frontend
from openai import AsyncOpenAI

from opentela.cli.localmesh import LocalMesh, free_port
from opentela.engines.embedded import MODEL_ID
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ALIAS = "smol"
NAME = "aliases-ingress"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def alias_ingress(mesh: LocalMesh, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """An ingress configured (through a config file) with an alias, a retired name and a default model; its
    base URL once it sees the mesh's replicas."""
    config = tmp_path_factory.mktemp("aliases") / "otela.toml"
    config.write_text(
        "[gateway]\n"
        f'model_aliases = ["{ALIAS}={MODEL_ID}"]\n'
        f'retired_models = ["smollm-1={ALIAS}|SmolLM 1 left the catalog"]\n'
        f'default_model = "{ALIAS}"\n'
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    node = await mesh.add_worker(
        NAME, None, "--role", "ingress", "--http", f"127.0.0.1:{port}", "--config", str(config)
    )

    async def sees_replicas() -> bool:
        try:
            async with mesh.http().get(url + "/v1/models") as r:
                data = (await r.json())["data"] if r.status == 200 else []
        except aiohttp.ClientError:
            return False
        return any(m["id"] == MODEL_ID and len(m["replicas"]) >= 2 for m in data)

    try:
        await mesh.wait_for(sees_replicas, timeout=60, what="the alias ingress to see the replicas")
        yield url
    finally:
        await node.stop()
        mesh.nodes.pop(NAME, None)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def frontend(alias_ingress: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Frontend]:
    """A frontend on SQLite in front of the alias ingress."""
    fe = await start_frontend(alias_ingress, f"sqlite:///{tmp_path_factory.mktemp('aliases-fe') / 'fe.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


async def _row(fe: Frontend, row_id: str) -> UsageRow:
    async with fe.state.db.session() as s:
        row = await s.get(UsageRow, row_id)
    assert row is not None, f"no usage row {row_id}"
    return row


async def test_an_alias_is_routed_listed_and_metered_as_the_served_model(frontend: Frontend) -> None:
    # A key allowed the served id may use its alias.
    _, secret = await frontend.state.keys.create(KeySettings(name="alias", allowed_models=[MODEL_ID]))
    client = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    messages = [{"role": "user", "content": "Say hi."}]
    raw = await client.chat.completions.with_raw_response.create(
        model=ALIAS, messages=messages, max_tokens=4, temperature=0
    )
    assert raw.parse().choices[0].message.content and raw.headers["x-otela-model"] == MODEL_ID
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert (row.model, row.status, row.http_status) == (MODEL_ID, "ok", 200) and row.output_tokens > 0
    assert row.provider in {"demo-provider-1", "demo-provider-2"}  # served by a worker, not the alias ingress
    raw = await client.responses.with_raw_response.create(model=ALIAS, input="Say hi.", max_output_tokens=4)
    assert raw.parse().model == MODEL_ID
    assert (await _row(frontend, raw.headers["x-otela-usage-row"])).model == MODEL_ID
    # No model at all: the ingress's default.
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        async with http.post(
            frontend.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}
        ) as r:
            assert r.status == 200, await r.text()
            assert (await _row(frontend, r.headers["X-Otela-Usage-Row"])).model == MODEL_ID
    listing = {m.id: m.model_extra for m in (await client.models.list()).data}
    assert listing[ALIAS]["alias_for"] == MODEL_ID and listing[ALIAS]["default"] is True
    assert "alias_for" not in listing[MODEL_ID]
    found = await client.models.retrieve(ALIAS)
    assert found.id == ALIAS and found.model_extra["alias_for"] == MODEL_ID
    await client.close()


async def test_retired_and_unknown_names_get_openai_404s(frontend: Frontend, alias_ingress: str) -> None:
    key, secret = await frontend.state.keys.create(KeySettings(name="retired"))
    client = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    with pytest.raises(openai.NotFoundError) as retired:
        await client.chat.completions.create(model="smollm-1", messages=[{"role": "user", "content": "x"}])
    body = retired.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"  # type: ignore[index]
    assert f"use '{ALIAS}' instead (SmolLM 1 left the catalog)" in body["message"]  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as gone:
        await client.models.retrieve("smollm-1")
    assert "has been retired" in gone.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as typo:
        await client.chat.completions.create(model="smoll", messages=[{"role": "user", "content": "x"}])
    assert f"did you mean '{ALIAS}'" in typo.value.body["message"]  # type: ignore[index]
    # The ingress itself answers the same way to a client that reaches it directly.
    async with aiohttp.ClientSession() as http:
        async with http.post(
            alias_ingress + "/v1/chat/completions",
            json={"model": "smollm-1", "messages": [{"role": "user", "content": "x"}]},
        ) as r:
            error = (await r.json())["error"]
    assert (
        r.status == 404
        and set(error) == {"message", "type", "param", "code"}
        and "retired" in error["message"]
    )
    # A retired name is refused before anything is metered; the unknown one reached the ingress and has its row.
    rows = await frontend.state.ledger.rows(key_id=key.id)
    assert [(r.model, r.http_status) for r in rows] == [("smoll", 404)]
    await client.close()
