"""Routing features with real node processes: engines advertise metadata, the ingress routes on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"


def sim(gpu: str, *extra: str) -> list[str]:
    return [
        *OTELA,
        "engine",
        "simulated",
        "--model",
        MODEL,
        "--gpu",
        gpu,
        "--default-max-tokens",
        "1",
        *extra,
    ]


async def test_constraints_trust_and_weights_use_what_engines_advertise(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress(env={"OTELA_GATEWAY_REQUEST_POLICIES": "weighted"})
        await mesh.add_worker("h100", sim("H100", "--quantization", "fp8"), provider="lab-h")
        await mesh.add_worker("a10", sim("A10", "--context-length", "8192"), provider="lab-a")
        replicas = await mesh.wait_serving(MODEL, 2, timeout=90)
        settings = {r["provider_id"]: r["settings"] for r in replicas}
        assert settings["lab-h"]["gpu"] == "H100" and settings["lab-h"]["quantization"] == "fp8"
        assert settings["lab-a"]["context_length"] == 8192 and settings["lab-h"]["context_length"] == 32768
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        http = mesh.http()

        async def post(headers: dict[str, str]) -> tuple[int, str, dict]:
            async with http.post(f"{mesh.api}/chat/completions", json=body, headers=headers) as resp:
                return resp.status, resp.headers.get("X-Otela-Provider", ""), json.loads(await resp.read())

        for _ in range(4):
            assert (await post({"X-Otela-Require": "gpu=H100"}))[:2] == (200, "lab-h")
            assert (await post({"X-Otela-Require": "context<=8k"}))[:2] == (200, "lab-a")
            assert (await post({"X-Otela-Trusted-Providers": "lab-a"}))[:2] == (200, "lab-a")
        status, _, answer = await post({"X-Otela-Require": "quantization>=16bit,gpu=H100"})
        assert status == 503 and answer["error"]["code"] == "unmet_constraint"
        status, _, answer = await post({"X-Otela-Trusted-Providers": "nobody"})
        assert status == 503 and answer["error"]["code"] == "no_trusted_provider"
        # The H100 advertises about five times the A10's throughput: a weighted choice leans towards it.
        served = [(await post({"X-Otela-Policy": "weighted"}))[1] for _ in range(40)]
        assert served.count("lab-h") > served.count("lab-a")
