"""A mesh of real `otela start` processes on loopback: used by the demo, the integration tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp

from opentela.engines.base import free_port as engine_free_port
from opentela.errors import ConfigError

OTELA = [sys.executable, "-m", "opentela"]


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on `host`, from outside the range the OS gives to port-0 binds."""
    return engine_free_port(host)


def port_is_free(host: str, port: int) -> bool:
    """Whether host:port can be bound now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def embedded_engine_argv(threads: int = 1, parallel: int = 2) -> list[str]:
    """The command of an embedded SmolLM2 engine (the node injects the port)."""
    return [*OTELA, "engine", "embedded", "--threads", str(threads), "--parallel", str(parallel)]


class NodeProcess:
    """One `otela` child process, in its own process group, with its output in a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name, self.argv, self.log_path, self.env = name, list(argv), log_path, env
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        return f"<NodeProcess {self.name} pid={self.pid} exit={self.exited()}>"

    @property
    def pid(self) -> int | None:
        """The child's pid once started."""
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        """Spawn the child."""
        self._log = open(self.log_path, "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=self._log,
            stderr=self._log,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )

    def exited(self) -> int | None:
        """Exit code when the child ended, else None."""
        return None if self.proc is None else self.proc.returncode

    def log_text(self) -> str:
        """The whole log."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """Last lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def signal(self, sig: int, *, group: bool = False) -> None:
        """Send `sig` to the child (or its whole process group, engine included)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    async def wait(self, timeout: float) -> int:
        """Wait for the child to exit."""
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the node leaves and stops its engine), then SIGKILL to the group if it lingers."""
        if self.proc is not None:
            if self.proc.returncode is None:
                self.signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(self.proc.wait(), timeout)
                except TimeoutError:
                    self.signal(signal.SIGKILL, group=True)
                    await self.proc.wait()
            # An engine orphaned by a SIGKILLed node still sits in the node's process group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


class LocalMesh:
    """An ingress plus workers, each a real process, all on 127.0.0.1."""

    def __init__(
        self, workdir: Path, *, http_port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.http_port = http_port or free_port()
        self.fabric_port = free_port()
        self.api = f"http://127.0.0.1:{self.http_port}/v1"
        self.env = env
        self.nodes: dict[str, NodeProcess] = {}
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"<LocalMesh {self.api} nodes={list(self.nodes)}>"

    @property
    def bootstrap(self) -> str:
        """Fabric address of the ingress."""
        return f"127.0.0.1:{self.fabric_port}"

    async def __aenter__(self) -> LocalMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _node(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> NodeProcess:
        argv = [
            *OTELA,
            "start",
            "--key-file",
            str(self.workdir / f"{name}.key"),
            "--log-dir",
            str(self.logs),
            *args,
        ]
        merged = {**(self.env or os.environ), **env} if env else self.env
        node = NodeProcess(name, argv, self.logs / f"{name}.log", merged)
        self.nodes[name] = node
        return node

    async def start_ingress(
        self, *extra: str, name: str = "ingress", env: dict[str, str] | None = None
    ) -> NodeProcess:
        """Start the ingress (fabric on the mesh's bootstrap port, API on its HTTP port) and wait for /v1/health.

        `env` adds variables (e.g. OTELA_GATEWAY_* settings) for this process only.
        """
        node = self._node(
            name,
            [
                "--role",
                "ingress",
                "--listen",
                self.bootstrap,
                "--http",
                f"127.0.0.1:{self.http_port}",
                "--provider-id",
                "ingress",
                *extra,
            ],
            env,
        )
        await node.start()
        await self.wait_for(
            lambda: self.get_json("/health"), timeout=60, what="the ingress to answer /v1/health"
        )
        return node

    async def add_worker(
        self, name: str, engine_argv: Sequence[str] | None, *extra: str, provider: str | None = None
    ) -> NodeProcess:
        """Start a worker bootstrapping from the ingress, with an engine command or none."""
        args = [
            "--listen",
            "127.0.0.1:0",
            "--bootstrap",
            self.bootstrap,
            "--provider-id",
            provider or name,
            *extra,
        ]
        if engine_argv:
            args += ["--", *engine_argv]
        node = self._node(name, args)
        await node.start()
        return node

    def http(self) -> aiohttp.ClientSession:
        """A shared client session (closed by aclose)."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        return self._http

    async def get_json(self, path: str) -> Any:
        """GET {api}{path} as JSON; None when the ingress does not answer."""
        try:
            async with self.http().get(
                self.api.removesuffix("/v1") + ("" if path.startswith("/v1") else "/v1") + path
            ) as r:
                return await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            return None

    async def wait_for(self, probe: Any, *, timeout: float, what: str, interval: float = 0.1) -> Any:
        """Poll the async `probe` until it returns something truthy; fail with every child's log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if node.exited() is not None and node.exited() != 0 and node.name.startswith("ingress"):
                    raise ConfigError(f"{node.name} exited ({node.exited()}):\n{node.log_tail()}")
            result = await probe()
            if result:
                return result
            await asyncio.sleep(interval)
        tails = "\n".join(f"--- {n.name} ---\n{n.log_tail()}" for n in self.nodes.values())
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")

    async def replicas(self, model: str) -> list[dict[str, Any]]:
        """The ingress's replicas of `model` (from /v1/models)."""
        listing = await self.get_json("/models") or {"data": []}
        return next((m["replicas"] for m in listing["data"] if m["id"] == model), [])

    async def wait_serving(self, model: str, count: int, timeout: float = 120) -> list[dict[str, Any]]:
        """Wait until `count` healthy replicas of `model` are SERVING at the ingress."""

        async def probe() -> list[dict[str, Any]] | None:
            live = [r for r in await self.replicas(model) if r["state"] == "SERVING" and not r["suspected"]]
            return live if len(live) >= count else None

        return await self.wait_for(probe, timeout=timeout, what=f"{count} replicas of {model}")

    async def aclose(self) -> None:
        """Stop every node, workers first, then the ingress."""
        await asyncio.gather(*(n.stop() for n in reversed(list(self.nodes.values()))))
        if self._http is not None:
            await self._http.close()
            self._http = None
