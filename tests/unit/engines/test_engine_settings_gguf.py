"""A GGUF file's header gives its quantization quickly, and a damaged or foreign file gives nothing."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import pytest

from opentela.engines.embedded import embedded_model_path
from opentela.engines.gguf_info import file_type_settings, gguf_settings, read_metadata


def write_gguf(path: Path, file_type: int | None, **strings: str) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # an array before the wanted key is skipped
    if file_type is not None:
        writer.add_file_type(file_type)
    for key, value in strings.items():
        writer.add_string(key.replace("__", "."), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_shipped_smollm2_is_q4_1_and_read_at_once() -> None:
    started = time.perf_counter()
    assert gguf_settings(embedded_model_path()) == {"quantization": "q4_1"}
    assert time.perf_counter() - started < 1.0  # the header only: the 49k-token vocabulary is skipped
    meta = read_metadata(embedded_model_path(), ("llama.context_length", "general.architecture"))
    assert meta == {"llama.context_length": 8192, "general.architecture": "llama"}


@pytest.mark.parametrize(
    ("file_type", "want"),
    [
        (gguf.LlamaFileType.MOSTLY_Q8_0, {"quantization": "q8_0"}),
        (gguf.LlamaFileType.MOSTLY_Q4_K_M, {"quantization": "q4_k_m"}),
        (gguf.LlamaFileType.MOSTLY_IQ4_XS, {"quantization": "iq4_xs"}),
        (gguf.LlamaFileType.MOSTLY_F16, {"dtype": "fp16"}),
        (gguf.LlamaFileType.MOSTLY_BF16, {"dtype": "bf16"}),
        (gguf.LlamaFileType.ALL_F32, {"dtype": "fp32"}),
        (gguf.LlamaFileType.MOSTLY_Q4_1 | gguf.LlamaFileType.GUESSED, {"quantization": "q4_1"}),
        (999, {}),
        (None, {}),
    ],
)
def test_file_types_name_the_weights(tmp_path: Path, file_type: int | None, want: dict[str, str]) -> None:
    path = write_gguf(tmp_path / "m.gguf", None if file_type is None else int(file_type), general__name="m")
    assert gguf_settings(path) == want


def test_file_type_values_of_the_wrong_kind_are_ignored() -> None:
    assert file_type_settings("3") == {} and file_type_settings(True) == {} and file_type_settings(-1) == {}


def test_damaged_and_foreign_files_give_nothing(tmp_path: Path) -> None:
    whole = write_gguf(tmp_path / "whole.gguf", int(gguf.LlamaFileType.MOSTLY_Q8_0)).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:40])
    (tmp_path / "text.gguf").write_text("not a model")
    (tmp_path / "empty.gguf").write_bytes(b"")
    for name in ("cut.gguf", "text.gguf", "empty.gguf", "missing.gguf"):
        assert gguf_settings(tmp_path / name) == {}, name
