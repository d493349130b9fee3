"""QoS constraints: parsing, matching against record metadata, and the 503 that names the unmet one."""

from __future__ import annotations

import json

import pytest
from meshkit import chat, gateway_kit, record

from opentela.errors import InvalidRequestError
from opentela.gateway.constraints import parse_constraints, quantization_bits, satisfying

H100 = [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}]
A100 = [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}]


def test_parse_terms_and_reject_nonsense() -> None:
    got = parse_constraints("gpu=H100, engine=vllm,quantization>=8bit,context>=32768")
    assert [str(c) for c in got] == ["gpu=H100", "engine=vllm", "quantization>=8bit", "context>=32768"]
    assert parse_constraints(None) == ()
    for bad in ("gpu>H100", "context>=lots", "=x", "quantization>=fast", "gpu"):
        with pytest.raises(InvalidRequestError):
            parse_constraints(bad)


def test_quantization_bits() -> None:
    assert quantization_bits(None) == 16  # unquantized
    assert quantization_bits("fp8") == quantization_bits("8bit") == quantization_bits("8") == 8
    assert quantization_bits("awq") == quantization_bits("Q4_K_M") == 4
    assert quantization_bits("mystery") is None


def test_matching_against_hardware_and_model_settings() -> None:
    fast = record("fast", engine="vllm", gpus=H100, settings={"context_length": 131072})
    small = record(
        "small", engine="vllm", gpus=A100, settings={"quantization": "awq", "context_length": 8192}
    )
    cpu = record("cpu", engine="embedded", settings={"quantization": "q4_0", "context_length": 8192})
    sim = record("sim", settings={"gpu": "H200", "quantization": "fp8"})
    pool = [fast, small, cpu, sim]

    def names(text: str) -> list[str]:
        kept, _ = satisfying(pool, "sim-model", parse_constraints(text))
        return sorted(r.session_id for r in kept)

    assert names("gpu=H100") == ["s-fast"]
    assert names("gpu=h200") == ["s-sim"]  # a declared GPU counts, case and dashes do not
    assert names("gpu!=H100") == ["s-cpu", "s-sim", "s-small"]
    assert names("gpu=cpu") == ["s-cpu"]
    assert names("engine=vllm") == ["s-fast", "s-small"]
    assert names("quantization>=8bit") == ["s-fast", "s-sim"]
    assert names("quantization=awq") == ["s-small"]
    assert names("context>=32k") == ["s-fast"]  # a replica that does not say is never assumed to
    assert names("gpu_memory>=80GB") == ["s-fast"]
    assert names("gpu_memory>=40") == ["s-fast", "s-small"]
    assert names("gpus>=1,engine=vllm,context<=8192") == ["s-small"]
    assert names("provider=cpu") == ["s-cpu"]


async def test_unsatisfiable_constraint_is_a_503_naming_it() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", gpus=A100, settings={"context_length": 8192})
        await kit.replica("b", gpus=H100, settings={"context_length": 8192})
        status, headers, _ = await kit.post(chat(), {"X-Otela-Require": "gpu=H100"})
        assert (status, headers["X-Otela-Session"]) == (200, "s-b")
        status, _, body = await kit.post(chat(), {"X-Otela-Require": "gpu=H100,context>=32768"})
        assert status == 503
        error = json.loads(body)["error"]
        assert error["code"] == "unmet_constraint"
        assert "context>=32768" in error["message"] and "8192" in error["message"]
        status, _, body = await kit.post(chat(metadata={"require": "gpu=B200"}))
        assert status == 503 and "gpu=B200" in json.loads(body)["error"]["message"]
        status, _, body = await kit.post(chat(), {"X-Otela-Require": "context>=huge"})
        assert status == 400
