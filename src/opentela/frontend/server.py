"""The frontend as a long-lived component: open and migrate the database, reconcile, serve with uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from opentela.errors import ConfigError
from opentela.frontend._config import FrontendConfig
from opentela.frontend.app import create_app
from opentela.frontend.db import Database
from opentela.frontend.ingress import Ingress, IngressClient
from opentela.frontend.ingress_inprocess import InProcessIngress
from opentela.frontend.keys import KeyStore
from opentela.frontend.local_admission import AdmissionLock, admission_lock_path
from opentela.frontend.login import Login
from opentela.frontend.state import FrontendState
from opentela.frontend.trace_recorder import TraceRecorder, trace_salt
from opentela.frontend.usage import UsageLedger
from opentela.gateway.state import GatewayState

logger = logging.getLogger(__name__)


def load_or_create_admin_token(path: Path) -> str:
    """The admin token kept in `path` (mode 0600), created on first use."""
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "otela-admin-" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def head_deadline_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with the two deadlines it lacks: a connection that sends nothing is closed after
    the keep-alive timeout (uvicorn starts that timer only after a first response), and a request head must be
    complete within `header_timeout` seconds of its first byte (uvicorn has no header deadline at all, so one
    header byte a second would hold a connection forever)."""

    class HeadDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            # The same timer uvicorn arms after each response; any byte received cancels it.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def _awaiting_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._awaiting_head():
                self._disarm()
            elif self._head_timer is None and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(header_timeout, self._head_overdue)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._awaiting_head():  # a pipelined request's head was already complete
                self._disarm()

        def _head_overdue(self) -> None:
            self._head_timer = None
            if self._awaiting_head() and not self.transport.is_closing():
                logger.debug("closing a connection whose request head took over %.0f s", header_timeout)
                self.transport.close()

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeadDeadlineProtocol


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a running loop: the process's own signal handling stays in charge."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


ADMISSION_MODES = ("auto", "memory", "database")


def _admission_mode(mode: str, db: Database) -> tuple[bool, AdmissionLock | None]:
    """Whether to admit in memory, and the lock that makes it safe (see frontend/local_admission.py)."""
    if mode not in ADMISSION_MODES:
        raise ConfigError(f"frontend.admission must be one of {', '.join(ADMISSION_MODES)}, not {mode!r}")
    path = admission_lock_path(db)
    if path is None:
        if mode == "memory" and db.dialect != "sqlite":
            raise ConfigError(
                "frontend.admission = memory needs a SQLite file; PostgreSQL may have several replicas, "
                "so it admits through the database"
            )
        return mode == "memory", None
    in_memory = mode in ("auto", "memory")
    return in_memory, AdmissionLock(path, exclusive=in_memory)


class Frontend:
    """API keys, metering and the dashboard in front of one ingress. Build with `await Frontend.create(...)`."""

    def __init__(self, state: FrontendState, login: Login) -> None:
        self.state = state
        self.login = login
        self.app = create_app(state, login)
        self.url = ""
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock: AdmissionLock | None = None

    @property
    def in_process(self) -> bool:
        """Whether requests go to a gateway in this process rather than over HTTP."""
        return isinstance(self.state.ingress, InProcessIngress)

    def __repr__(self) -> str:
        return f"<Frontend {self.url or 'not listening'} -> {self.state.ingress.base_url} {self.state.db!r}>"

    @classmethod
    async def create(
        cls,
        config: FrontendConfig,
        *,
        db_url: str,
        admin_token: str,
        instance: str,
        gateway: GatewayState | None = None,
    ) -> Frontend:
        """Open the database (migrations applied), reconcile rows a crash left pending, build the app.

        Given the `gateway` of this process, requests go to it in-process instead of over HTTP.
        """
        started = time.perf_counter()
        db = await Database.open(db_url)
        lock: AdmissionLock | None = None
        try:
            in_memory, lock = _admission_mode(config.admission, db)
            ledger = UsageLedger(db, instance, in_memory=in_memory, forward_early=config.forward_early)
            await ledger.reconcile(config.stale_pending_after)
            trace = TraceRecorder(
                ledger.writer, await trace_salt(db, config.trace_salt), config.prefix_hashes
            )
            keys = KeyStore(db, cache_seconds=config.key_cache_seconds)
            login = await Login.create(config, db, keys)
        except BaseException:
            if lock is not None:
                lock.release()
            await db.aclose()
            raise
        logger.info(
            "frontend database ready in %.2f s: %r, admitting %s",
            time.perf_counter() - started,
            db,
            "in memory" if in_memory else "through the database",
        )
        http = IngressClient(config.ingress, request_timeout=config.request_timeout)
        ingress: Ingress = http if gateway is None else InProcessIngress(gateway, http)
        frontend = cls(FrontendState(config, db, keys, ledger, ingress, admin_token, trace), login)
        frontend._lock = lock
        return frontend

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (0: a free port) and serve in the background; returns the base URL."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
        bound = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            proxy_headers=False,
            server_header=False,
            http=head_deadline_protocol(self.state.config.header_timeout),
            # uvicorn takes whole seconds; rounding up never closes a connection earlier than configured.
            timeout_keep_alive=max(1, math.ceil(self.state.config.keepalive_timeout)),
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="frontend-http")
        deadline = time.monotonic() + 30
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the frontend's HTTP server stopped while starting")
            if time.monotonic() > deadline:
                raise TimeoutError("the frontend's HTTP server did not start within 30 s")
            await asyncio.sleep(0.02)
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{bound}"
        logger.info("frontend listening on %s, forwarding to %s", self.url, self.state.ingress.base_url)
        return self.url

    async def aclose(self) -> None:
        """Stop serving (in-flight requests get a few seconds), then close the ingress pool and the database."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
            self._server = self._task = None
        await self.state.ingress.aclose()
        await self.login.aclose()
        try:
            await self.state.trace.aclose()
            await self.state.ledger.aclose()
        finally:
            await self.state.db.aclose()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    async def __aenter__(self) -> Frontend:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
