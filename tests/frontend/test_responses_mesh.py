"""The Responses API and model retrieval through the frontend and a real mesh with the embedded engine (which
serves chat completions only, so the ingress translates), with the official Python SDK and the official JS SDK,
and the usage rows they leave; and with the Python SDK straight at the ingress."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from frontend_helpers import start_frontend
from openai import AsyncOpenAI

import system_tools
from opentela.cli.localmesh import LocalMesh
from opentela.engines.embedded import MODEL_ID
from opentela.frontend import Frontend
from opentela.frontend.keys import KeySettings
from opentela.frontend.schema import UsageRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
NPM_DIR = Path(tempfile.gettempdir()) / "otela-test-openai-js"
"""Where the JS SDK is installed once and reused by later runs."""


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def frontend(mesh: LocalMesh, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Frontend]:
    """A frontend on SQLite in front of the session's mesh."""
    fe = await start_frontend(mesh.api, f"sqlite:///{tmp_path_factory.mktemp('responses') / 'fe.db'}")
    try:
        yield fe
    finally:
        await fe.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def client(frontend: Frontend) -> AsyncIterator[AsyncOpenAI]:
    """The official SDK with a fresh key."""
    _, secret = await frontend.state.keys.create(KeySettings(name="responses"))
    sdk = AsyncOpenAI(base_url=frontend.url + "/v1", api_key=secret, max_retries=0)
    yield sdk
    await sdk.close()


async def _row(fe: Frontend, row_id: str) -> UsageRow:
    async with fe.state.db.session() as s:
        row = await s.get(UsageRow, row_id)
    assert row is not None, f"no usage row {row_id}"
    return row


async def test_a_response_and_its_usage_row(frontend: Frontend, client: AsyncOpenAI) -> None:
    raw = await client.responses.with_raw_response.create(
        model=MODEL_ID,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        instructions="Answer in one word.",
        max_output_tokens=8,
        temperature=0,
        top_p=1,
        metadata={"purpose": "test"},
        store=False,
    )
    reply = raw.parse()
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == MODEL_ID
    assert reply.status in ("completed", "incomplete") and reply.output_text
    assert reply.output[0].type == "message" and reply.metadata == {"purpose": "test"}
    assert reply.usage is not None and 0 < reply.usage.output_tokens <= 8
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert (row.status, row.http_status, row.endpoint, row.model) == ("ok", 200, "/v1/responses", MODEL_ID)
    assert (row.input_tokens, row.output_tokens) == (reply.usage.input_tokens, reply.usage.output_tokens)
    assert not row.tokens_estimated and not row.stream and row.node == raw.headers["x-otela-node"]


async def test_a_streamed_response_and_its_usage_row(frontend: Frontend, client: AsyncOpenAI) -> None:
    raw = await client.responses.with_raw_response.create(
        model=MODEL_ID, input="Count to three.", max_output_tokens=8, temperature=0, stream=True
    )
    events = [e async for e in raw.parse()]
    kinds = [e.type for e in events]
    assert kinds[:4] == STREAM_ORDER and kinds[-4:-1] == CLOSING
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas and final.output_text == deltas and final.usage is not None
    row = await _row(frontend, raw.headers["x-otela-usage-row"])
    assert row.status == "ok" and row.stream and not row.tokens_estimated
    assert (row.input_tokens, row.output_tokens) == (final.usage.input_tokens, final.usage.output_tokens)
    assert row.ttft_ms is not None and 0 < row.ttft_ms <= row.latency_ms


async def test_models_retrieve_and_refusals(frontend: Frontend, client: AsyncOpenAI) -> None:
    model = await client.models.retrieve(MODEL_ID)
    assert (model.id, model.object) == (MODEL_ID, "model") and model.model_extra["replicas"]
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("SmolLM2-135M-Instruc")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert f"did you mean '{MODEL_ID}'" in caught.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model=MODEL_ID, input="hi", previous_response_id="resp_123")
    assert bad.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert "does not store" in bad.value.body["message"]  # type: ignore[index]


async def test_the_python_sdk_straight_at_the_ingress(mesh: LocalMesh) -> None:
    # No frontend in between: the ingress itself answers the SDK (it asks for no key).
    sdk = AsyncOpenAI(base_url=mesh.api, api_key="unused", max_retries=0)
    try:
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL_ID, input="Say hi.", max_output_tokens=8, temperature=0
        )
        reply = raw.parse()
        assert reply.object == "response" and reply.model == MODEL_ID and reply.output_text
        assert reply.usage is not None and 0 < reply.usage.output_tokens <= 8
        assert raw.headers["x-otela-provider"] in {"demo-provider-1", "demo-provider-2"}
        stream = await sdk.responses.create(model=MODEL_ID, input="Say hi.", max_output_tokens=8, stream=True)
        events = [e async for e in stream]
        kinds = [e.type for e in events]
        assert kinds[:4] == STREAM_ORDER and kinds[-4:-1] == CLOSING
        assert kinds[-1] in ("response.completed", "response.incomplete")
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas and events[-1].response.output_text == deltas  # type: ignore[union-attr]
        model = await sdk.models.retrieve(MODEL_ID)
        assert (model.id, model.object) == (MODEL_ID, "model") and len(model.model_extra["replicas"]) >= 2
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.models.retrieve("SmolLM2-135M-Instruc")
        assert f"did you mean '{MODEL_ID}'" in caught.value.body["message"]  # type: ignore[index]
    finally:
        await sdk.close()


def _node_and_npm() -> tuple[str, str]:
    """node and npm, installed by apt when missing (as the browser tests install Chromium)."""
    if not (shutil.which("node") and shutil.which("npm")):
        system_tools.apt_install("nodejs", "npm")
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):
        raise system_tools.Unavailable("apt-get installed nodejs and npm but `node` or `npm` is missing")
    return node, npm


def _js_sdk(npm: str) -> Path:
    """The openai npm package in NPM_DIR, installed from the registry on first use."""
    if not (NPM_DIR / "node_modules" / "openai" / "package.json").exists():
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        (NPM_DIR / "package.json").write_text('{"name": "otela-test-openai-js", "private": true}\n')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "openai"],
            cwd=NPM_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.fail(
                f"npm install openai failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}"
            )
    return NPM_DIR


JS_SCRIPT = """
import OpenAI from "openai";
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY, maxRetries: 0 });
const model = process.env.MODEL;
const plain = await client.responses.create({ model, input: "Say hi.", max_output_tokens: 8, temperature: 0 });
const kinds = [];
let streamed = "";
const stream = await client.responses.create({ model, input: "Say hi.", max_output_tokens: 8, stream: true });
for await (const event of stream) {
  kinds.push(event.type);
  if (event.type === "response.output_text.delta") streamed += event.delta;
}
const found = await client.models.retrieve(model);
let missing = null;
try { await client.models.retrieve("no-such/model"); } catch (e) { missing = { status: e.status, code: e.code }; }
const summary = { object: plain.object, text: plain.output_text, usage: plain.usage };
console.log(JSON.stringify({ plain: summary, kinds, streamed, found: found.id, missing }));
"""


@pytest.mark.timeout(420)
@pytest.mark.parametrize("through", ["frontend", "ingress"])
async def test_the_official_js_sdk(through: str, frontend: Frontend, mesh: LocalMesh) -> None:
    try:
        node, npm = await asyncio.to_thread(_node_and_npm)
    except system_tools.Unavailable as exc:
        pytest.skip(f"node cannot run here: {exc}")
    where = await asyncio.to_thread(_js_sdk, npm)
    script = where / "responses_check.mjs"
    script.write_text(JS_SCRIPT)
    if through == "frontend":
        _, secret = await frontend.state.keys.create(KeySettings(name="js"))
        base = frontend.url + "/v1"
    else:  # the mesh's ingress takes no key; the SDK insists on one
        secret, base = "unused", mesh.api
    env = {**os.environ, "BASE_URL": base, "API_KEY": secret, "MODEL": MODEL_ID}
    proc = await asyncio.create_subprocess_exec(
        node, str(script), cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-2000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["plain"]["object"] == "response" and seen["plain"]["text"]
    assert seen["plain"]["usage"]["output_tokens"] > 0
    assert seen["kinds"][:4] == STREAM_ORDER and seen["kinds"][-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert seen["streamed"] and seen["found"] == MODEL_ID
    assert seen["missing"] == {"status": 404, "code": "model_not_found"}
