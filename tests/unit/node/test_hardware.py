"""The hardware probe reports the documented keys and reads GPUs from nvidia-smi when NVML is absent."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from opentela.node import hardware
from opentela.node.hardware import parse_nvidia_smi, probe_hardware

# Output in the format of `nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits`.
SMI_OUTPUT = """0, NVIDIA H100 80GB HBM3, 81559, GPU-1a2b3c4d-0000-1111-2222-333344445555
1, NVIDIA H100 80GB HBM3, 81559, GPU-9f8e7d6c-0000-1111-2222-333344445555
"""


def fake_nvidia_smi(bin_dir: Path, body: str) -> Path:
    """Write a stand-in `nvidia-smi` (a shell script, not NVIDIA's tool) into bin_dir."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_probe_has_documented_keys_and_is_json_serializable() -> None:
    hw = probe_hardware()
    assert set(hw) == {"gpus", "gpu_source", "cpu", "ram_mib", "os", "hostname"}
    assert isinstance(hw["gpus"], list)
    cpu = hw["cpu"]
    assert isinstance(cpu["model"], str) and cpu["model"]
    assert isinstance(cpu["cores"], int) and cpu["cores"] >= 1
    assert isinstance(cpu["threads"], int) and cpu["threads"] >= cpu["cores"]
    assert 1 <= cpu["usable"] <= cpu["threads"]
    assert isinstance(cpu["flags"], list) and set(cpu["flags"]) <= set(hardware.CPU_FLAGS)
    assert isinstance(hw["ram_mib"], int) and hw["ram_mib"] > 100
    assert isinstance(hw["os"], str) and hw["os"]
    assert isinstance(hw["hostname"], str) and hw["hostname"]
    assert json.loads(json.dumps(hw)) == hw


def test_fake_nvidia_smi_on_path_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(
        tmp_path / "bin",
        f'[ "$1" = "{hardware.NVIDIA_SMI_QUERY[0]}" ] || exit 9\ncat <<EOF\n{SMI_OUTPUT}EOF\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hw = probe_hardware(use_nvml=False)
    assert hw["gpu_source"] == "nvidia-smi"
    assert hw["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "uuid": "GPU-1a2b3c4d-0000-1111-2222-333344445555",
        },
        {
            "index": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "uuid": "GPU-9f8e7d6c-0000-1111-2222-333344445555",
        },
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g["index"] for g in probe_hardware(use_nvml=False)["gpus"]] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9f8e,0")
    assert [g["index"] for g in probe_hardware(use_nvml=False)["gpus"]] == [1, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert probe_hardware(use_nvml=False)["gpus"] == []


def test_broken_or_hung_nvidia_smi_means_no_gpus_quickly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    fake_nvidia_smi(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    hw = probe_hardware(use_nvml=False)
    assert hw["gpus"] == [] and hw["gpu_source"] is None
    fake_nvidia_smi(tmp_path / "bin", "exec sleep 30\n")
    monkeypatch.setattr(hardware, "NVIDIA_SMI_TIMEOUT", 0.3)
    t0 = time.monotonic()
    assert probe_hardware(use_nvml=False)["gpus"] == []
    assert time.monotonic() - t0 < 5


def test_no_nvidia_smi_means_no_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    hw = probe_hardware(use_nvml=False)
    assert hw["gpus"] == [] and hw["gpu_source"] is None


def test_parse_skips_unparsable_rows() -> None:
    text = "0, Tesla T4, 15360, GPU-aaa\n1, Tesla T4, [N/A], GPU-bbb\ngarbage\n"
    assert parse_nvidia_smi(text) == [
        {"index": 0, "name": "Tesla T4", "memory_mib": 15360, "uuid": "GPU-aaa"}
    ]
