"""`otela status` shows what each engine advertises beside its model."""

from __future__ import annotations

import io

from rich.console import Console

from opentela.cli.status import model_text, status_table


def test_models_show_their_engine_and_settings() -> None:
    vllm = {
        "id": "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "engine": "vllm",
        "settings": {
            "quantization": "awq",
            "dtype": "fp16",
            "tensor_parallel_size": 2,
            "context_length": 32768,
        },
    }
    assert model_text(vllm) == "Qwen/Qwen2.5-7B-Instruct-AWQ (vllm, awq, fp16, tp 2, ctx 32768)"
    embedded = {
        "id": "SmolLM2",
        "engine": "embedded",
        "settings": {"quantization": "q4_1", "tensor_parallel_size": 1},
    }
    assert model_text(embedded) == "SmolLM2 (embedded, q4_1)"  # a parallel size of one goes without saying
    assert model_text({"id": "m", "engine": "", "settings": "odd"}) == "m"
    assert model_text("odd") == "?"


SMOL = {"quantization": "q4_1", "context_length": 2048}


def test_the_table_lists_models_with_settings() -> None:
    record = {
        "peer_id": "12D3KooWxyz",
        "session_id": "abcdef123456",
        "provider_id": "lab",
        "roles": ["worker"],
        "lifecycle": "SERVING",
        "hardware": {},
        "models": [
            {
                "id": "SmolLM2",
                "engine": "embedded",
                "settings": {"quantization": "q4_1", "context_length": 2048},
            }
        ],
        "addrs": [],
    }
    out = io.StringIO()
    Console(file=out, width=200).print(status_table("mesh", [record], []))
    assert "SmolLM2 (embedded, q4_1, ctx 2048)" in out.getvalue()
