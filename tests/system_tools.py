"""Finding and installing the system tools that test fixtures run (runuser, ip, nft, PostgreSQL, Slurm, apt-get).

A non-login shell's PATH often lacks the sbin folders, where Debian puts most of these tools, so every lookup
also searches them, and every command a fixture starts gets a PATH that includes them: tools those commands
run in turn (dpkg's ldconfig, `ip netns exec`'s target) are then found as well.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class Unavailable(Exception):
    """A tool cannot run on this machine; the message says why (fixtures turn it into the skip reason)."""


def search_path(path: str | None = None) -> str:
    """`path` (default: this process's PATH) followed by the system folders it lacks, sbin ones included."""
    given = [p for p in (os.environ.get("PATH", "") if path is None else path).split(os.pathsep) if p]
    return os.pathsep.join([*given, *(d for d in SYSTEM_DIRS if d not in given)])


def tool_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`base` (default: this process's environment) with PATH extended by search_path, plus `extra`."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = search_path(env.get("PATH", ""))
    env.update(extra)
    return env


def postgres_bindir() -> Path | None:
    """The newest Debian PostgreSQL bin folder (initdb, pg_ctl, createdb, psql), else the folder of `initdb`."""
    found = sorted(glob.glob(f"{POSTGRES_BIN_GLOB}/initdb"), key=_version_key)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb", path=search_path())
    return Path(os.path.realpath(initdb)).parent if initdb else None


def _version_key(initdb: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin/initdb: "9.6" < "15" needs numbers, not strings.
    version = Path(initdb).parent.parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_tool(name: str) -> str | None:
    """Full path of `name`: PATH first, then the sbin and bin folders, then PostgreSQL's bin folders."""
    found = shutil.which(name, path=search_path())
    if found:
        return found
    newest_first = sorted(
        glob.glob(POSTGRES_BIN_GLOB), key=lambda d: _version_key(f"{d}/initdb"), reverse=True
    )
    for bindir in newest_first:
        found = shutil.which(name, path=bindir)
        if found:
            return found
    return None


def require_tool(name: str, package: str) -> str:
    """Full path of `name`; Unavailable naming the Debian `package` that provides it when it is missing."""
    found = find_tool(name)
    if found is None:
        raise Unavailable(
            f"`{name}` ({package}) is not installed (searched PATH and {', '.join(SYSTEM_DIRS)})"
        )
    return found


def apt_install(*packages: str, timeout: float = 900) -> float:
    """apt-get install `packages` (refreshing the package lists once on failure); returns the seconds it took.

    Unavailable when there is no apt-get, we are not root, or the install fails.
    """
    what = ", ".join(packages)
    apt_get = find_tool("apt-get")
    if apt_get is None:
        raise Unavailable(f"{what} missing and there is no apt-get to install it")
    if os.geteuid() != 0:
        raise Unavailable(f"{what} missing and installing it (apt-get) needs root")
    # dpkg refuses to run when ldconfig and start-stop-daemon (both in sbin) are not on its PATH.
    env = tool_env(DEBIAN_FRONTEND="noninteractive")
    argv = [
        apt_get,
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=600",
        *packages,
    ]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if out.returncode != 0:  # stale package lists: refresh once and retry
        update = subprocess.run(
            [apt_get, "update", "-q"], capture_output=True, text=True, env=env, timeout=600, check=False
        )
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if out.returncode != 0:
            raise Unavailable(
                f"apt-get install {' '.join(packages)} failed: {(update.stderr + out.stderr)[-800:]}"
            )
    return time.monotonic() - started


def ensure_tool(name: str, package: str) -> str:
    """Full path of `name`, installing Debian's `package` with apt-get when it is missing."""
    found = find_tool(name)
    if found is None:
        apt_install(package)
        found = require_tool(name, package)
    return found
