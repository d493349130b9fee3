"""What engines advertise: names normalised, command lines read, engines' documented answers parsed defensively."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opentela._types import Lifecycle, SessionId
from opentela.engines._registry import engine_adapter, engine_from_command, engine_from_name
from opentela.engines.advertised import (
    ADVERTISED_KEYS,
    clean_settings,
    last_flag,
    merge_settings,
    normalise_dtype,
    normalise_quantization,
    normalise_version,
    parse_count,
)
from opentela.engines.base import advertised_settings
from opentela.engines.embedded import MODEL_ID, embedded_model_path
from opentela.fabric.identity import Identity
from opentela.registry.record import ModelEntry, NodeRecord

DOCUMENTED = Path(__file__).parent / "documented_responses"
PY = sys.executable
OWNER = Identity.generate()


def documented(name: str) -> Any:
    """A hand-written answer in the engine's documented shape (see documented_responses/README.md)."""
    return json.loads((DOCUMENTED / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("Q4_1", "q4_1"),
        ("MOSTLY_Q4_K_M", "q4_k_m"),
        ("mostly_q4_1_some_f16", "q4_1"),
        (" AWQ ", "awq"),
        ("awq_marlin", "awq"),
        ("gptq_marlin", "gptq"),
        ("fbgemm_fp8", "fp8"),
        ("fp8", "fp8"),
        ("compressed-tensors", "compressed-tensors"),
        ("none", None),
        ("", None),
        ("F16", None),  # unquantized weights, not a method
        ("bfloat16", None),
        ("drop table;", None),
        (4, None),
        (None, None),
    ],
)
def test_quantization_names_are_normalised(raw: Any, want: str | None) -> None:
    assert normalise_quantization(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("torch.float16", "fp16"),
        ("float32", "fp32"),
        ("float", "fp32"),
        ("auto", None),
        ("fp8_e4m3", "fp8_e4m3"),
        (16, None),
    ],
)
def test_dtypes_are_normalised(raw: Any, want: str | None) -> None:
    assert normalise_dtype(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        *[("4096", 4096), (4096, 4096), ("32k", 32000), ("32K", 32768), ("1M", 1 << 20)],
        *[("0", None), ("-1", None), ("auto", None), ("2.5", None), (True, None), (2.0, None), (2**40, None)],
    ],
)
def test_counts_read_like_vllm_reads_them(raw: Any, want: int | None) -> None:
    assert parse_count(raw) == want


def test_versions_drop_unknown_builds() -> None:
    assert normalise_version("v0.8.5") == "0.8.5"
    assert normalise_version("b5009-5cbf13fc") == "b5009-5cbf13fc"
    assert normalise_version("b0-unknown") is None  # llama.cpp built outside its git tree
    assert normalise_version("x" * 100) is None
    assert normalise_version(None) is None


def test_the_last_flag_wins_whatever_its_spelling() -> None:
    argv = ["vllm", "serve", "m", "-tp", "2", "--tensor-parallel-size=4", "--dtype", "half"]
    assert last_flag(argv, ("--tensor-parallel-size", "-tp")) == "4"
    assert last_flag(argv[:5], ("--tensor-parallel-size", "-tp")) == "2"
    assert last_flag(["-q"], ("-q",)) is None  # a flag without its value says nothing


def test_the_command_line_wins_and_disagreements_are_listed() -> None:
    merged, mismatches = merge_settings(
        {"context_length": 4096, "quantization": "AWQ", "engine_version": "xllamacpp-1"},
        {"context_length": 8192, "quantization": "awq", "dtype": "bfloat16", "engine_version": "b1-a"},
    )
    assert merged == {
        "context_length": 4096,
        "quantization": "awq",
        "dtype": "bf16",
        "engine_version": "xllamacpp-1",
    }
    assert mismatches == [("context_length", 4096, 8192)]  # versions are named differently, never a mismatch


# --- vLLM ---------------------------------------------------------------------------------------------------


def test_vllm_reads_its_flags_behind_a_launcher() -> None:
    argv = shlex.split(
        "srun -q gpu-qos vllm serve Qwen/Qwen2.5-7B-Instruct-AWQ -tp 2 --pipeline-parallel-size=2 "
        "--quantization awq_marlin --dtype bfloat16 --max-model-len 32k --data-parallel-size 1"
    )
    assert engine_adapter("vllm").launch_settings(argv) == {
        "quantization": "awq",  # srun's -q is the launcher's, not vLLM's
        "dtype": "bf16",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "data_parallel_size": 1,
        "context_length": 32000,
    }
    built = engine_from_name("vllm", "m", 8123, tensor_parallel_size=4, dtype="auto", max_model_len=8192)
    assert engine_adapter("vllm").launch_settings(built.argv) == {
        "tensor_parallel_size": 4,
        "context_length": 8192,
    }


def test_vllm_reports_its_version_and_window() -> None:
    vllm = engine_adapter("vllm")
    assert vllm.report_paths == ("/version",) and vllm.native_responses
    assert vllm.reported_settings({"/version": documented("vllm__version")}) == {
        "engine_version": "0.8.5.post1"
    }
    entry = documented("vllm__v1_models")["data"][0]
    assert advertised_settings(entry) == {"context_length": 32768}
    assert vllm.reported_settings({}) == {}


# --- SGLang -------------------------------------------------------------------------------------------------


def test_sglang_reads_its_flags() -> None:
    argv = shlex.split(
        "python -m sglang.launch_server --model-path m --tp-size 4 --pp-size 2 --dp 2 "
        "--quantization w8a8_fp8 --dtype float16 --context-length 65536"
    )
    assert engine_adapter("sglang").launch_settings(argv) == {
        "quantization": "fp8",
        "dtype": "fp16",
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "data_parallel_size": 2,
        "context_length": 65536,
    }
    built = engine_from_name("sglang", "m", 8124, tensor_parallel_size=2, context_length=4096)
    assert engine_adapter("sglang").launch_settings(built.argv) == {
        "tensor_parallel_size": 2,
        "context_length": 4096,
    }


def test_sglang_reports_its_server_arguments() -> None:
    sglang = engine_adapter("sglang")
    reports = {"/get_server_info": documented("sglang__get_server_info")}
    reports["/get_model_info"] = documented("sglang__get_model_info")
    assert set(sglang.report_paths) == set(reports)
    assert sglang.reported_settings(reports) == {
        "quantization": "fp8",
        "dtype": "bf16",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "engine_version": "0.4.6.post4",
    }  # context_length is null there (left to the model): /v1/models says it
    assert advertised_settings(documented("sglang__v1_models")["data"][0]) == {"context_length": 131072}
    assert sglang.model_file(["python", "-m", "sglang.launch_server", "--model-path", "m"], reports) is None


# --- llama.cpp ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "want"),
    [
        ("llama-server -m x.gguf -c 8192 -np 4", {"context_length": 2048}),
        ("llama-server -m x.gguf --ctx-size=8192 --parallel 4 --kv-unified", {"context_length": 8192}),
        ("llama-server -m x.gguf -c 4096", {"context_length": 4096}),
        ("llama-server -m x.gguf -c 0", {}),  # the model's own window: /props says it
        ("srun -c 8 llama-server -m x.gguf", {}),  # srun's -c is CPUs per task
        ("llama-server -hf ggml-org/Qwen3-8B-GGUF:Q4_K_M", {"quantization": "q4_k_m"}),
        ("llama-server -hf ggml-org/Qwen3-8B-GGUF:F16", {"dtype": "fp16"}),
        ("llama-server -hf ggml-org/Qwen3-8B-GGUF:latest", {}),
    ],
)
def test_llamacpp_reads_its_flags(command: str, want: dict[str, Any]) -> None:
    assert engine_adapter("llamacpp").launch_settings(shlex.split(command)) == want


def test_llamacpp_reports_its_slot_window_and_build() -> None:
    llamacpp = engine_adapter("llamacpp")
    reports = {"/props": documented("llamacpp__props")}
    assert llamacpp.reported_settings(reports) == {"context_length": 2048, "engine_version": "b5009-5cbf13fc"}
    # The documented /v1/models meta has the training window only, which is no serving window.
    assert advertised_settings(documented("llamacpp__v1_models")["data"][0]) == {}
    # /props names a file that is not on this machine: no header to read.
    assert llamacpp.model_file(["llama-server", "-hf", "org/repo"], reports) is None


def test_llamacpp_and_embedded_find_their_gguf_file() -> None:
    smollm = str(embedded_model_path())
    assert engine_adapter("llamacpp").model_file(["llama-server", "-m", smollm], {}) == smollm
    assert engine_adapter("llamacpp").model_file(
        ["llama-server", "-hf", "o/r"], {"/props": {"model_path": smollm}}
    )
    assert engine_adapter("embedded").model_file([PY, "-m", "opentela", "engine", "embedded"], {}) == smollm


# --- embedded -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "window"),
    [({"parallel": 2}, 2048), ({"parallel": 3}, 2048), ({"parallel": 2, "ctx_size": 8192}, 4096)],
)
def test_embedded_window_per_slot(options: dict[str, int], window: int) -> None:
    spec = engine_from_name("embedded", MODEL_ID, 18123, threads=1, **options)
    got = engine_adapter("embedded").launch_settings(spec.argv)
    assert got["context_length"] == window
    assert got["engine_version"].startswith("xllamacpp-")  # the node's own environment runs it
    elsewhere = ["/opt/other/bin/python", *spec.argv[1:]]
    assert "engine_version" not in engine_adapter("embedded").launch_settings(elsewhere)


def test_embedded_ignores_a_mangled_command() -> None:
    argv = engine_from_command([PY, "-m", "opentela", "engine", "embedded", "--parallel", "two"]).argv
    assert engine_adapter("embedded").launch_settings(argv) == {}


# --- defensive parsing --------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(
    "version tp_size pp_size dp_size quantization dtype context_length n_ctx default_generation_settings "
    "build_info model_ftype model_path meta max_model_len otela".split()
)
hostile_object = st.dictionaries(
    field_names, json_values | st.dictionaries(field_names, json_values), max_size=6
)


def schema_accepts(found: dict[str, Any]) -> None:
    """Whatever an adapter advertises fits the record schema and survives the wire."""
    record = NodeRecord(
        session_id=SessionId("s"),
        peer_id=OWNER.peer_id,
        provider_id="p",
        lifecycle=Lifecycle.SERVING,
        version=1,
        models=(ModelEntry("m", "e", found),),
    ).signed(OWNER)
    wire = msgpack.unpackb(msgpack.packb(record.to_wire(), use_bin_type=True), raw=False)
    assert NodeRecord.from_wire(wire) == record


@settings(max_examples=200, deadline=None)
@given(report=hostile_object | json_values, entry=hostile_object)
def test_no_answer_crashes_an_adapter_and_only_clean_values_come_out(report: Any, entry: Any) -> None:
    for name in ("vllm", "sglang", "llamacpp", "embedded"):
        adapter = engine_adapter(name)
        found = adapter.reported_settings({path: report for path in adapter.report_paths})
        assert set(found) <= set(ADVERTISED_KEYS)
        assert clean_settings(found) == found  # already normalised
        schema_accepts(found)
    listed = advertised_settings(entry)
    assert clean_settings({k: v for k, v in listed.items() if k in ADVERTISED_KEYS}) == {
        k: v for k, v in listed.items() if k in ADVERTISED_KEYS
    }


@settings(max_examples=200, deadline=None)
@given(
    argv=st.lists(
        st.sampled_from("-c -np -tp --dtype -q --parallel --ctx-size x 0".split()) | st.text(max_size=8)
    )
)
def test_no_command_line_crashes_an_adapter(argv: list[str]) -> None:
    for name, program in (
        ("vllm", ["vllm", "serve"]),
        ("sglang", ["sglang", "serve"]),
        ("llamacpp", ["llama-server"]),
    ):
        found = engine_adapter(name).launch_settings(program + argv)
        assert clean_settings(found) == found
    found = engine_adapter("embedded").launch_settings([PY, "-m", "opentela", "engine", "embedded", *argv])
    assert clean_settings(found) == found
