"""Hardware and model catalogs: shipped entries, operators' own files, published parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opentela.errors import ConfigError
from opentela.scheduler.hardware import builtin_catalog, host_cpu_device, load_catalog
from opentela.scheduler.models import builtin_models, load_model

REQUIRED_DEVICES = (
    "A100-40G", "A100-80G", "H100-SXM", "H100-PCIe", "H200", "GH200", "L40S", "A10G", "RTX-3090", "RTX-4090",
    "V100-32G",
)  # fmt: skip


def test_catalog_has_the_required_devices_with_sources() -> None:
    catalog = builtin_catalog()
    for name in REQUIRED_DEVICES:
        device = catalog[name]
        assert device.kind == "gpu" and device.source
        assert device.peak("fp16") > 0 and device.bandwidth > 0 and device.memory_bytes > 0
    cpus = [d for d in catalog.values() if d.kind == "cpu"]
    assert cpus and all(d.cores > 0 and d.peak("int8") > d.peak("fp32") for d in cpus)


def test_catalog_lookup_is_case_insensitive_and_explains_unknown_names() -> None:
    assert builtin_catalog()["h100-sxm"].name == "H100-SXM"
    with pytest.raises(ConfigError, match=r"unknown device 'B999'.*A100-40G"):
        builtin_catalog()["B999"]


def test_missing_dtype_falls_back_to_fp16() -> None:
    a100 = builtin_catalog()["A100-80G"]
    assert a100.peak("fp8") == a100.peak("fp16")
    h100 = builtin_catalog()["H100-SXM"]
    assert h100.peak("fp8") == pytest.approx(2 * h100.peak("fp16"), rel=1e-3)


def test_operator_file_adds_and_overrides_devices(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "MI300X:\n  memory_gib: 192\n  memory_bandwidth_gbs: 5300\n  tflops: {fp16: 1307.4, fp8: 2614.9}\n"
        "  interconnect_gbs: 448\n  devices_per_node: 8\n  source: AMD MI300X datasheet\n"
        "A100-80G:\n  memory_gib: 80\n  memory_bandwidth_gbs: 1935\n  tflops: {fp16: 312}\n"
    )
    catalog = load_catalog(extra)
    assert catalog["MI300X"].memory_gib == 192
    assert catalog["A100-80G"].memory_bandwidth_gbs == 1935
    assert len(catalog) == len(builtin_catalog()) + 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("X:\n  memory_gib: 1\n  tflops: {fp16: 1}\n", "lacks the field 'memory_bandwidth_gbs'"),
        ("X:\n  memory_gib: 1\n  memory_bandwidth_gbs: 1\n  tflops: {fp17: 1}\n", "unknown dtypes"),
        ("- just a list\n", "mapping of device name"),
    ],
)
def test_bad_hardware_files_are_rejected_clearly(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_catalog(path)


def test_host_cpu_device_reads_the_widest_matrix_extension() -> None:
    info = "model name\t: Test CPU\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n"
    cpu = host_cpu_device(threads=4, memory_bandwidth_gbs=50, cpuinfo=info)
    assert cpu.kind == "cpu" and cpu.cores == 4
    assert cpu.peak("int8") == pytest.approx(128 * 4 * 2.0e9)
    assert cpu.peak("fp32") == pytest.approx(32 * 4 * 2.0e9)
    assert "avx512_vnni" in cpu.source


@pytest.mark.parametrize(
    "name, params",
    [
        # Parameter counts of the published safetensors checkpoints.
        ("Llama-2-13b", 13_015_864_320),
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
        ("Llama-3.3-70B-Instruct", 70_553_706_496),
        ("Mixtral-8x7B-v0.1", 46_702_792_704),
        ("SmolLM2-135M-Instruct", 134_515_008),
    ],
)
def test_shipped_models_have_their_published_parameter_counts(name: str, params: int) -> None:
    assert load_model(name).num_params == params


def test_paper_models_ship() -> None:
    names = builtin_models()
    for wanted in ("Qwen3-1.7B", "Llama-2-13b-hf", "CodeLlama-34b-hf", "Llama-3.3-70B-Instruct", "Qwen3-32B"):
        assert wanted in names
    moe = load_model("Qwen3-30B-A3B")
    assert moe.is_moe and moe.active_mlp_params < moe.mlp_params / 10


def test_any_config_json_path_works(tmp_path: Path) -> None:
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 100}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path))
    assert (spec.num_kv_heads, spec.head_dim) == (4, 16)
    with pytest.raises(ConfigError, match="lacks 'vocab_size'"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({k: v for k, v in config.items() if k != "vocab_size"}))
        load_model(str(bad))
    with pytest.raises(ConfigError, match="unknown model"):
        load_model("GPT-17")
