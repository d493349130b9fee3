"""A real embedded engine's settings reach the mesh: the record says q4_1 and its window, and QoS routes on them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from opentela.cli.localmesh import LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """An ingress and one worker running the embedded SmolLM2 engine: the least a routed request needs."""
    workdir: Path = tmp_path_factory.mktemp("advertised")
    async with LocalMesh(workdir) as m:
        await m.start_ingress()
        await m.add_worker("worker", embedded_engine_argv(threads=1, parallel=2), provider="lab")
        await m.wait_serving(MODEL_ID, 1, timeout=90)
        yield m


async def test_the_record_carries_quantization_and_window(mesh: LocalMesh) -> None:
    table = await mesh.get_json("/dnt/table")
    (entry,) = [m for r in table if r["lifecycle"] == "SERVING" for m in r["models"]]
    assert entry["engine"] == "embedded"
    settings = entry["settings"]
    assert settings["quantization"] == "q4_1"  # the GGUF header's general.file_type
    assert settings["context_length"] == 2048  # 2048 tokens for each of the 2 slots
    assert settings["engine_version"].startswith("xllamacpp-")
    (replica,) = await mesh.replicas(MODEL_ID)
    assert replica["settings"]["quantization"] == "q4_1"


async def test_requests_route_on_the_quantization(mesh: LocalMesh) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    http = mesh.http()
    for wanted in ("quantization=q4_1", "quantization=Q4_1,context>=2048", "quantization<=4bit"):
        async with http.post(
            f"{mesh.api}/chat/completions", json=body, headers={"X-Otela-Require": wanted}
        ) as r:
            assert r.status == 200, (wanted, await r.text())
    async with http.post(
        f"{mesh.api}/chat/completions", json=body, headers={"X-Otela-Require": "quantization=awq"}
    ) as refused:
        error = (await refused.json())["error"]
    assert refused.status == 503 and error["code"] == "unmet_constraint"
    assert (
        "quantization=awq" in error["message"] and "q4_1" in error["message"]
    )  # the constraint, and the offer
