"""The engine supervisor: runs an engine command in its own process group, waits for it to serve, stops it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from opentela.engines.base import EngineSpec
from opentela.errors import EngineCrashedError, EngineUnavailableError, UpstreamTimeout

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 64 * 1024


def _parent_death_hook() -> Any:
    """A pre-exec function asking Linux to SIGKILL the engine when the node dies, or None elsewhere.

    A node killed with SIGKILL (Slurm at the end of an allocation, the OOM killer) cannot stop its
    engine, and the engine, in its own session, would otherwise keep a GPU busy as an orphan.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        # Runs in the child between fork and exec: nothing here may take a lock another thread held.
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the node died before the request took effect
            os._exit(1)

    return hook


class EngineSupervisor:
    """Starts one engine process, reports when it serves, notices when it exits, and stops it for good.

    The engine runs in a new session (its own process group) with stdout and stderr appended to
    `log_path`; `stop` signals the whole group, so workers the engine forked go too, and reaps the
    leader, so no zombie is left. On Linux the engine is also killed if the node process dies; start
    it from the event loop's thread, since Linux ties that to the thread that forked.
    """

    def __init__(
        self,
        spec: EngineSpec,
        log_path: str | os.PathLike[str],
        *,
        ready_timeout: float | None = None,
        poll_interval: float = 0.25,
        kill_on_parent_death: bool = True,
    ) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.ready_timeout = spec.ready_timeout if ready_timeout is None else ready_timeout
        self.poll_interval = poll_interval
        self.kill_on_parent_death = kill_on_parent_death
        self._proc: subprocess.Popen[bytes] | None = None
        self._exited = asyncio.Event()
        self._log_offset = 0
        self._output_offset = 0
        self._pidfd: int | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """The engine's process id (also its process group id), once started."""
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        """The exit status once the engine exited (negative: killed by that signal), else None."""
        return self._proc.returncode if self._proc else None

    @property
    def output_offset(self) -> int:
        """Where this run's engine output starts in the log file (after the header line the node wrote)."""
        return self._output_offset

    @property
    def running(self) -> bool:
        """True between a successful start and the engine's exit."""
        return self._proc is not None and not self._exited.is_set()

    async def start(self) -> None:
        """Spawn the engine; raises EngineCrashedError when the command cannot be run at all."""
        if self._proc is not None:
            raise RuntimeError("this supervisor already started its engine")
        if await self._port_taken():
            raise EngineCrashedError(
                f"something already listens on {self.spec.host}:{self.spec.port}; engine {self.spec.name} "
                "would fail to bind, or the node would talk to the wrong server: choose another port"
            )
        self._proc = self._spawn()
        logger.info("engine.started", extra={"engine": self.spec.name, "pid": self._proc.pid})
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name=f"engine-watch-{self.pid}")

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Fast local work (append a header line, fork): not worth a thread hop.
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(
                f"=== {stamp} otela starting engine {self.spec.name}: {self.spec.command_line}\n".encode()
            )
            log.flush()
            self._output_offset = log.tell()
            try:
                # The child gets its own copy of the log descriptor; ours closes with this block.
                return subprocess.Popen(
                    self.spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.spec.env},
                    start_new_session=True,
                    preexec_fn=_parent_death_hook() if self.kill_on_parent_death else None,
                )
            except OSError as exc:
                log.write(f"=== could not start the engine: {exc}\n".encode())
                raise EngineCrashedError(f"could not start engine {self.spec.name}: {exc}") from exc

    async def _port_taken(self) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.spec.host, self.spec.port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _watch(self) -> None:
        """Set `_exited` when the process ends: a pidfd wakes us on Linux, polling elsewhere."""
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            if pidfd is not None:
                readable = asyncio.Event()
                loop.add_reader(pidfd, readable.set)
                try:
                    await readable.wait()
                finally:
                    loop.remove_reader(pidfd)
            # poll() reaps the engine so it never lingers as a zombie; without a pidfd it is the only way.
            while self._proc.poll() is None:  # noqa: ASYNC110
                await asyncio.sleep(min(self.poll_interval, 0.05))
        finally:
            if pidfd is not None:
                os.close(pidfd)
        logger.info("engine.exited", extra={"engine": self.spec.name, "returncode": self._proc.returncode})
        self._exited.set()

    async def wait_ready(self) -> list[dict[str, Any]]:
        """Poll the health path until it answers 200 with a non-empty ``data`` list; return those models.

        Raises EngineCrashedError (with the log tail) when the engine exits first and UpstreamTimeout
        when it is not ready within ``ready_timeout`` seconds.
        """
        if self._proc is None:
            raise EngineUnavailableError("the engine was not started")
        url = self.spec.base_url + self.spec.health_path
        deadline = time.monotonic() + self.ready_timeout
        async with aiohttp.ClientSession() as http:
            while True:
                if self._exited.is_set():
                    raise self._crashed("exited before it was ready")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamTimeout(
                        f"engine {self.spec.name} was not ready at {url} after {self.ready_timeout:g} s; "
                        f"last log lines:\n{self.log_tail()}"
                    )
                models = await self._probe(http, url, min(remaining, 10.0))
                if models and not self._exited.is_set():
                    logger.info("engine.ready", extra={"engine": self.spec.name, "models": len(models)})
                    return models
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), min(self.poll_interval, max(remaining, 0)))

    async def _probe(self, http: aiohttp.ClientSession, url: str, limit: float) -> list[dict[str, Any]]:
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                if resp.status != 200:
                    return []
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return []  # not listening yet, still loading, or not speaking JSON yet
        data = body.get("data") if isinstance(body, dict) else None
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def _crashed(self, what: str) -> EngineCrashedError:
        return EngineCrashedError(
            f"engine {self.spec.name} {what} (exit status {self.returncode}); last log lines of "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    async def wait_exit(self) -> int:
        """Wait for the engine to exit and return its status."""
        if self._proc is None:
            raise EngineUnavailableError("the engine was not started")
        await self._exited.wait()
        assert self._proc.returncode is not None
        return self._proc.returncode

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the engine's process group, SIGKILL it after `timeout` seconds, and reap the engine."""
        if self._proc is None:
            return None
        try:
            if not self._exited.is_set():
                self._signal_group(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self._exited.wait(), timeout)
                except TimeoutError:
                    logger.warning("engine.kill", extra={"engine": self.spec.name, "after_s": timeout})
            # Also catch workers that outlive their leader (they still hold the group id).
            self._signal_group(signal.SIGKILL)
            try:
                await asyncio.wait_for(self._exited.wait(), 10.0)
            except TimeoutError:
                logger.error("engine.unkillable", extra={"engine": self.spec.name, "pid": self.pid})
        finally:
            if self._watcher is not None and not self._watcher.done():
                self._watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watcher
            if self._proc.returncode is None:
                # Last resort when cancelled mid-stop: never leave the engine behind as a zombie.
                self._signal_group(signal.SIGKILL)
                self._proc.wait(timeout=5)
        return self._proc.returncode

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def log_tail(self, n_lines: int = 40) -> str:
        """The last `n_lines` lines this engine wrote to its log (earlier runs' lines excluded)."""
        try:
            with open(self.log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                start = max(self._log_offset, size - _TAIL_BYTES)
                log.seek(start)
                data = log.read()
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n_lines:])

    async def __aenter__(self) -> EngineSupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        state = (
            "not started"
            if self._proc is None
            else ("running" if self.running else f"exited {self.returncode}")
        )
        return f"<EngineSupervisor {self.spec.name} pid={self.pid} {state} {self.spec.base_url}>"
