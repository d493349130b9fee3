"""QoS constraints on what engines advertise: quantization names, dtype, parallel sizes, window, engine version."""

from __future__ import annotations

import json

import pytest
from meshkit import chat, gateway_kit, record

from opentela.errors import InvalidRequestError
from opentela.gateway.constraints import describe_observed, parse_constraints, quantization_bits, satisfying

EMBEDDED = {"quantization": "q4_1", "context_length": 2048, "engine_version": "xllamacpp-0.2.6"}
VLLM_AWQ = {"quantization": "awq", "dtype": "fp16", "tensor_parallel_size": 2, "context_length": 32768}
VLLM_BF16 = {
    "dtype": "bf16",
    "tensor_parallel_size": 4,
    "pipeline_parallel_size": 2,
    "engine_version": "0.8.5",
}
OLD_NODE: dict[str, object] = {
    "context_length": 8192
}  # a node of the previous release says no more than this
POOL = [
    record("emb", engine="embedded", settings=EMBEDDED),
    record("awq", engine="vllm", settings=VLLM_AWQ),
    record("bf16", engine="vllm", settings=VLLM_BF16),
    record("old", engine="vllm", settings=OLD_NODE),
    record("tp", engine="tp", settings={"tp_degree": 3}),
]


def names(text: str) -> list[str]:
    kept, _ = satisfying(POOL, "sim-model", parse_constraints(text))
    return sorted(r.session_id.removeprefix("s-") for r in kept)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("quantization=q4_1", ["emb"]),
        ("quantization=Q4_1", ["emb"]),  # names compare normalised
        ("quantization=awq_marlin", ["awq"]),
        ("quantization=none", ["bf16", "old", "tp"]),  # not advertising a quantization is unquantized
        ("quantization=fp16", ["bf16", "old", "tp"]),
        ("quantization!=q4_1", ["awq", "bf16", "old", "tp"]),
        ("quantization<=4bit", ["awq", "emb"]),
        ("dtype=bf16", ["bf16"]),
        ("dtype=bfloat16", ["bf16"]),
        ("dtype=half", ["awq"]),
        ("dtype!=bf16", ["awq"]),  # a replica that does not say matches no constraint on it
        ("tp>=2", ["awq", "bf16", "tp"]),  # the tensor-parallel engine's tp_degree counts
        ("tp=4,pp=2", ["bf16"]),
        ("tensor_parallel_size=2", ["awq"]),
        ("context>=8k", ["awq", "old"]),
        ("context_length<4096", ["emb"]),
        ("engine_version>=0.8", ["bf16"]),
        ("engine_version<0.8.5", ["emb"]),  # versions of different engines: pair it with engine=
        ("engine=vllm,engine_version<0.8.5", []),
        ("engine_version=0.8.5", ["bf16"]),
    ],
)
def test_advertised_settings_are_matched(text: str, kept: list[str]) -> None:
    assert names(text) == kept


def test_bits_of_llama_cpp_names() -> None:
    assert quantization_bits("q5_k_s") == quantization_bits("Q5_1") == 5
    assert quantization_bits("iq4_xs") == quantization_bits("MOSTLY_Q4_1") == 4
    assert quantization_bits("awq_marlin") == 4 and quantization_bits("q8_0") == 8


@pytest.mark.parametrize("bad", ["dtype>=bf16", "tp>=two", "pp=many", "dp<x"])
def test_malformed_terms_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        parse_constraints(bad)


def test_the_refusal_lists_what_replicas_offer() -> None:
    (awq,) = parse_constraints("quantization=awq")
    offer = [r for r in POOL if r.session_id in ("s-emb", "s-old")]
    assert describe_observed(offer, "sim-model", awq) == "none, q4_1"


async def test_an_unmet_quantization_is_a_503_naming_it_and_the_offer() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", settings=EMBEDDED)
        status, headers, _ = await kit.post(chat(), {"X-Otela-Require": "quantization=q4_1"})
        assert (status, headers["X-Otela-Session"]) == (200, "s-a")
        status, _, body = await kit.post(chat(), {"X-Otela-Require": "quantization=awq"})
        error = json.loads(body)["error"]
        assert status == 503 and error["code"] == "unmet_constraint" and error["param"] == "quantization"
        assert "quantization=awq" in error["message"] and "q4_1" in error["message"]
