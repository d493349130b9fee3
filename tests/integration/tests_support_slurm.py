"""A real single-node Slurm cluster for tests: Debian's slurm-wlm and munge, installed if missing, run from a temp dir.

Everything the daemons write (state, spool, logs, pid files, the munge socket and key) lives under one directory,
and the daemons listen on ports picked at start, so parallel test runs on one host do not see each other.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from system_tools import Unavailable, apt_install, find_tool, tool_env

APT_PACKAGES = ("slurm-wlm", "munge")
_DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo")


class SlurmUnavailable(Exception):
    """Slurm cannot run here; the message says why (and carries the daemons' logs when they failed)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str | None:
    return find_tool(name)


def ensure_installed() -> float:
    """Install slurm-wlm and munge with apt-get when a daemon is missing; returns the seconds spent installing."""
    if all(_which(d) for d in _DAEMONS):
        return 0.0
    try:
        seconds = apt_install(*APT_PACKAGES, timeout=600)
    except Unavailable as exc:
        raise SlurmUnavailable(f"Slurm is not installed: {exc}") from exc
    missing = [d for d in _DAEMONS if not _which(d)]
    if missing:
        raise SlurmUnavailable(
            f"apt-get installed {' '.join(APT_PACKAGES)} but {', '.join(missing)} are missing"
        )
    return seconds


class SlurmCluster:
    """munged, slurmctld and slurmd for this host only; `env` is what clients (sbatch, scancel) need."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """This process's environment (read now: tests change it, PATH with the sbin folders) for this cluster."""
        return tool_env(SLURM_CONF=str(self.conf))

    def __repr__(self) -> str:
        return f"<SlurmCluster {self.node} conf={self.conf} daemons={list(self.procs)}>"

    def start(self, timeout: float = 60.0) -> None:
        """Start the daemons and wait until the node is idle; raises SlurmUnavailable with their logs otherwise."""
        try:
            self._start_munge()
            self._write_conf()
            for daemon, argv in (
                ("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-f", str(self.conf)]),
                ("slurmd", [_which("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", self.node]),
            ):
                out = open(self.root / f"{daemon}.out", "wb")  # the daemon holds its own copy
                self.procs[daemon] = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
                )
                out.close()
            self._wait_idle(timeout)
        except (OSError, subprocess.SubprocessError, SlurmUnavailable) as exc:
            logs = self.logs()
            self.stop()
            raise SlurmUnavailable(f"Slurm daemons did not start: {exc}\n{logs}") from exc

    def _start_munge(self) -> None:
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(mode=0o700, parents=True)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        argv = [
            _which("munged") or "munged",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={munge_dir / 'munged.log'}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
            "--foreground",
        ]
        self.procs["munged"] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tool_env(), start_new_session=True
        )
        deadline = time.monotonic() + 15
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmUnavailable("munged did not create its socket")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(exist_ok=True)
        # Room for two one-CPU jobs at once (a renewed job overlaps its successor) even on a one-core host:
        # config_overrides makes slurmd take the configured count over the detected one.
        cpus = max(os.cpu_count() or 1, 4)
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=otelatest",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'slurmd.log'}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    # No cgroups in a container: track processes through /proc, bind nothing.
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SwitchType=switch/none",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "KillWait=10",
                    "MinJobAge=60",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
                    f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with status {proc.returncode}")
            result = self.run("sinfo", "-h", "-n", self.node, "-o", "%t", check=False)
            state = result.stdout.strip()
            if state in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise SlurmUnavailable(
            f"node {self.node} not idle after {timeout:.0f} s (state {state or 'unknown'!r})"
        )

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        exe = _which(argv[0]) or argv[0]
        return subprocess.run(
            [exe, *argv[1:]], env=self.env, capture_output=True, text=True, timeout=30, check=check
        )

    def job_state(self, job_id: str) -> str:
        """The job's state (PENDING, RUNNING, ...), or '' once Slurm has forgotten it."""
        result = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return result.stdout.strip()

    def logs(self) -> str:
        """The daemons' logs, for failure messages."""
        parts = []
        for path in (
            self.root / "munge" / "munged.log",
            self.root / "slurmctld.log",
            self.root / "slurmctld.out",
            self.root / "slurmd.log",
            self.root / "slurmd.out",
        ):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-30:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (slurmd first), and reap them."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", "root", check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
