"""Project rules that a test can check: ruff is clean, imports point down the layers, and mypy passes."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def test_ruff_is_clean() -> None:
    out = run(sys.executable, "-m", "ruff", "check", "src", "tests", "benchmarks", "dev.py")
    assert out.returncode == 0, out.stdout + out.stderr


def test_layers_point_down() -> None:
    tool = BIN / "lint-imports"
    if not tool.exists():
        tool = Path(shutil.which("lint-imports") or "")
    if not tool.is_file():
        pytest.fail("import-linter is part of the test extras; install with pip install -e '.[test]'")
    out = run(str(tool))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.timeout(900)
def test_types_check() -> None:
    # Settings (strict layers, modules relaxed for now) live in pyproject.toml under [tool.mypy].
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is part of the test extras; install with pip install -e '.[test]'")
    out = run(sys.executable, "-m", "mypy", "src/opentela", timeout=840)
    assert out.returncode == 0, out.stdout + out.stderr


def test_test_module_names_are_unique() -> None:
    # Test folders are not packages, so pytest imports each file under its bare name: two files with one name
    # make the whole run stop at collection.
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of each pair: " + "; ".join(clashes)
