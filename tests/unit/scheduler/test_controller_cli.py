"""`otela controller` on the command line: its identity, and clear errors before it joins anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.cli.main import main
from opentela.fabric.identity import Identity


def test_show_peer_id_creates_and_keeps_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "controller.key"
    assert main(["controller", "--key-file", str(key), "--show-peer-id"]) == 0
    first = capsys.readouterr().out.strip()
    assert first == Identity.load_or_create(key).peer_id
    assert main(["controller", "--key-file", str(key), "--show-peer-id"]) == 0
    assert capsys.readouterr().out.strip() == first


def test_a_missing_or_bad_catalog_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = str(tmp_path / "controller.key")
    assert main(["controller", "--key-file", key]) == 2
    assert "--catalog FILE is required" in capsys.readouterr().err
    bad = tmp_path / "catalog.yaml"
    bad.write_text("models:\n  - id: Qwen3-1.7B\n    command: serve --port {port}\n")
    assert main(["controller", "--key-file", key, "--catalog", str(bad)]) == 2
    assert "'workload' needs at least a rate" in capsys.readouterr().err


def test_start_takes_controllers_and_checks_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--key-file", str(tmp_path / "k"), "--controllers", "not-a-peer-id"]) == 2
    assert "is not a peer id" in capsys.readouterr().err
