"""Timeout classes with real node processes, set through OTELA_* variables: a slow reasoning model answers,
a default-class model as slow gets the OpenAI timeout error."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = pytest.mark.integration


async def test_a_slow_reasoning_model_answers_and_a_slow_default_one_times_out(tmp_path: Path) -> None:
    env = {
        "OTELA_GATEWAY_FIRST_BYTE_TIMEOUT": "1",
        "OTELA_GATEWAY_MAX_RETRIES": "0",
        "OTELA_GATEWAY_TIMEOUT_CLASSES": "reasoning: first_byte_timeout=30",
    }
    # One engine serves both models alike, slower than the default first-byte timeout.
    engine = [
        *OTELA,
        "engine",
        "simulated",
        "--model",
        "sim-R1,sim-chat",
        "--ttft-ms",
        "2500",
        "--itl-ms",
        "0",
    ]
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress(env=env)
        await mesh.add_worker("worker", engine)
        await mesh.wait_serving("sim-R1", 1, timeout=90)
        await mesh.wait_serving("sim-chat", 1, timeout=30)
        http = mesh.http()
        for model, status in (("sim-R1", 200), ("sim-chat", 504)):
            body = {"model": model, "messages": [{"role": "user", "content": "think"}], "max_tokens": 2}
            async with http.post(f"{mesh.api}/chat/completions", json=body) as resp:
                answer = await resp.json()
                assert resp.status == status, answer
        error = answer["error"]
        assert (error["type"], error["code"], error["param"]) == ("timeout_error", "upstream_timeout", None)
        assert "within 1 s (timeout class default)" in error["message"]
