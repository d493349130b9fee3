"""The test fixtures' tool lookup: PATH first, then the system folders a non-login shell's PATH lacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import system_tools
from system_tools import find_tool, postgres_bindir, search_path, tool_env


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of one empty folder, a fake sbin folder and fake PostgreSQL versions under tmp_path."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(system_tools, "SYSTEM_DIRS", (str(tmp_path / "sbin"),))
    monkeypatch.setattr(system_tools, "POSTGRES_BIN_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))
    return tmp_path


def test_search_path_appends_the_missing_system_folders_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/opt/x:/usr/sbin")
    parts = search_path().split(os.pathsep)
    assert parts[:2] == ["/opt/x", "/usr/sbin"]
    assert parts.count("/usr/sbin") == 1
    assert {"/sbin", "/usr/local/sbin", "/usr/bin", "/bin"} <= set(parts)
    assert search_path("/a").split(os.pathsep)[0] == "/a"


def test_tool_env_extends_path_and_adds_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = tool_env(EXTRA="1")
    assert env["EXTRA"] == "1"
    assert env["PATH"].startswith("/usr/bin:/bin:")
    assert "/usr/sbin" in env["PATH"].split(os.pathsep)
    assert tool_env({"PATH": "/only"})["PATH"].startswith("/only:")


def test_find_tool_prefers_path_then_system_folders_then_postgresql(fake_system: Path) -> None:
    assert find_tool("nft") is None
    sbin_nft = executable(fake_system / "sbin" / "nft")
    assert find_tool("nft") == str(sbin_nft)
    path_nft = executable(fake_system / "bin" / "nft")
    assert find_tool("nft") == str(path_nft)
    executable(fake_system / "postgresql" / "9.6" / "bin" / "pg_ctl")
    newest = executable(fake_system / "postgresql" / "15" / "bin" / "pg_ctl")
    assert find_tool("pg_ctl") == str(newest)


def test_postgres_bindir_is_the_newest_version(fake_system: Path) -> None:
    assert postgres_bindir() is None
    executable(fake_system / "postgresql" / "9.6" / "bin" / "initdb")
    executable(fake_system / "postgresql" / "15" / "bin" / "initdb")
    assert postgres_bindir() == fake_system / "postgresql" / "15" / "bin"


def test_postgres_bindir_falls_back_to_initdb_on_the_path(fake_system: Path) -> None:
    real = executable(fake_system / "opt" / "pg" / "bin" / "initdb")
    (fake_system / "sbin").mkdir()
    (fake_system / "sbin" / "initdb").symlink_to(real)
    assert postgres_bindir() == real.parent
