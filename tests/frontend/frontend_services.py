"""Real services the frontend tests need, installed and started by the test setup: PostgreSQL and Chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import system_tools
from opentela.cli.localmesh import free_port
from system_tools import Unavailable, postgres_bindir, require_tool, tool_env

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


def apt_install(*packages: str) -> None:
    """apt-get install, timed into INSTALL_TIMES; Unavailable when apt is missing, we are not root, or it fails."""
    INSTALL_TIMES[" ".join(packages)] = system_tools.apt_install(*packages)


def ensure_chromium() -> Path:
    """Debian's Chromium, installed by apt when missing."""
    if not CHROMIUM.exists():
        apt_install("chromium")
    if not CHROMIUM.exists():
        raise Unavailable("apt-get installed chromium but /usr/bin/chromium is missing")
    return CHROMIUM


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

    def restart(self) -> None:
        """Stop the server (closing every client's connection) and start it again on the same port."""
        # The log file again: otherwise the new server keeps the output pipe this waits on open.
        log = str(self.datadir.parent / "log")
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", log, "-m", "fast", "-w", "restart"
        )

    def _run(self, *argv: str) -> None:
        # As root, PostgreSQL's tools run as the postgres user (initdb and the server refuse to run as root).
        prefix = [require_tool("runuser", "util-linux"), "-u", "postgres", "--"] if os.geteuid() == 0 else []
        out = subprocess.run(
            [*prefix, *argv], capture_output=True, text=True, env=tool_env(), timeout=120, check=False
        )
        if out.returncode != 0:
            raise Unavailable(f"{Path(argv[0]).name} failed: {(out.stdout + out.stderr)[-800:]}")


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Install (if needed), initdb and start PostgreSQL as the postgres user; stop and delete it afterwards."""
    bindir = postgres_bindir()
    if bindir is None:
        apt_install("postgresql")
        bindir = postgres_bindir()
        if bindir is None:
            raise Unavailable(
                "apt-get installed postgresql but no initdb was found under /usr/lib/postgresql"
            )
    if os.geteuid() == 0:
        require_tool("runuser", "util-linux")  # fail with the reason before anything is created
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
