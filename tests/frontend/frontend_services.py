"""Real services the frontend tests need, installed and started by the test setup: PostgreSQL and Chromium."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opentela.cli.localmesh import free_port

INSTALL_TIMES: dict[str, float] = {}
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Unavailable(Exception):
    """The service cannot run on this machine; the message says why (it becomes the skip reason)."""


def apt_install(*packages: str) -> None:
    """apt-get install, timed; Unavailable when apt is missing, we are not root, or the install fails."""
    if shutil.which("apt-get") is None:
        raise Unavailable(f"{', '.join(packages)} missing and there is no apt-get to install it")
    if os.geteuid() != 0:
        raise Unavailable(f"{', '.join(packages)} missing and installing needs root")
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = [
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=600",
        *packages,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    if out.returncode != 0:
        update = subprocess.run(
            ["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, check=False
        )
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
        if out.returncode != 0:
            raise Unavailable(
                f"apt-get install {' '.join(packages)} failed: {(update.stderr + out.stderr)[-500:]}"
            )
    INSTALL_TIMES[" ".join(packages)] = time.monotonic() - started


def ensure_chromium() -> Path:
    """Debian's Chromium, installed by apt when missing."""
    if not CHROMIUM.exists():
        apt_install("chromium")
    if not CHROMIUM.exists():
        raise Unavailable("apt-get installed chromium but /usr/bin/chromium is missing")
    return CHROMIUM


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@dataclass
class PostgresServer:
    """A throw-away PostgreSQL cluster on 127.0.0.1 and a free port."""

    bindir: Path
    datadir: Path
    port: int
    user: str

    def url(self, database: str) -> str:
        """URL of a database on this server."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database; returns its URL."""
        self._run(
            str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name
        )
        return self.url(name)

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        out = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise Unavailable(f"{Path(argv[0]).name} failed: {(out.stdout + out.stderr)[-800:]}")


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Install (if needed), initdb and start PostgreSQL as the postgres user; stop and delete it afterwards."""
    bindir = _postgres_bin()
    if bindir is None:
        apt_install("postgresql")
        bindir = _postgres_bin()
        if bindir is None:
            raise Unavailable(
                "apt-get installed postgresql but no initdb was found under /usr/lib/postgresql"
            )
    root = Path(tempfile.mkdtemp(prefix="otela-pg-"))
    datadir = root / "data"
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    server = PostgresServer(bindir, datadir, free_port(), user)
    started = time.monotonic()
    try:
        server._run(str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", user, "--no-sync")
        options = f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        server._run(
            str(bindir / "pg_ctl"),
            "-D",
            str(datadir),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        INSTALL_TIMES["postgresql initdb + start"] = time.monotonic() - started
        yield server
    finally:
        with contextlib.suppress(Unavailable, subprocess.TimeoutExpired):
            server._run(str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
