"""The node agent: joins the mesh, supervises the engine, keeps this node's record true, serves tunnelled requests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import logging
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from opentela._tasks import TaskSet, log_task_error
from opentela._types import PROTO_CONTROL, PROTO_HTTP, Lifecycle, PeerId, Stream
from opentela.engines.base import EngineSpec, advertised_settings
from opentela.errors import ConfigError, EngineCrashedError, OpenTelaError, UpstreamTimeout
from opentela.fabric._config import FabricConfig
from opentela.fabric.addresses import format_addr, parse_addr
from opentela.fabric.admission import admission_from_config
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.memory import memory_stream_pair
from opentela.fabric.relay import circuit_addr
from opentela.node._config import NodeConfig
from opentela.node.control import ControlService, EngineAssignment
from opentela.node.engine_health import check_http, watch_health
from opentela.node.hardware import probe_hardware
from opentela.node.http_service import LocalEngineProxy
from opentela.node.logsink import FailStopReport, LogSink, RecentLogs
from opentela.node.logwatch import FatalLogWatch, compile_patterns
from opentela.node.supervisor import EngineSupervisor
from opentela.registry._config import RegistryConfig
from opentela.registry.gossip import Gossip
from opentela.registry.housekeeping import Housekeeping
from opentela.registry.membership import Membership
from opentela.registry.record import ModelEntry, NodeRecord
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ENGINE_DIED = 3
EXIT_ENGINE_NOT_READY = 4
EXIT_ENGINE_UNHEALTHY = 5
EXIT_FATAL_LOG_LINE = 6


def default_provider_id() -> str:
    """user@host, so a provider is named even when the operator did not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "anonymous"
    return f"{user}@{socket.gethostname()}"


def advertised_addrs(listen_addrs: list[str], configured: tuple[str, ...]) -> tuple[str, ...]:
    """What peers should dial: the configured addresses, else the bound ones with wildcards made concrete."""
    if configured:
        return configured
    out: list[str] = []
    for addr in listen_addrs:
        host, port, _ = parse_addr(addr)
        if host in ("0.0.0.0", "::", ""):
            ips = {"127.0.0.1"}
            with contextlib.suppress(OSError):
                ips.update(
                    info[4][0]
                    for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
                    if not info[4][0].startswith("127.")
                )
            # Routable addresses first: peers try them in order.
            out.extend(f"{ip}:{port}" for ip in sorted(ips, key=lambda ip: ip.startswith("127.")))
        else:
            out.append(f"{host}:{port}")
    return tuple(out)


class NodeAgent:
    """One OpenTela node: fabric host, registry replica, gossip, liveness, and optionally an engine."""

    def __init__(
        self,
        identity: Identity,
        node: NodeConfig,
        fabric: FabricConfig | None = None,
        registry: RegistryConfig | None = None,
        *,
        engine: EngineSpec | None = None,
        log_dir: Path | None = None,
        node_log: RecentLogs | None = None,
    ) -> None:
        compile_patterns(node.fatal_log_patterns)  # a bad pattern is a configuration error, found now
        self.log_sink = LogSink(node.log_sink, timeout=node.log_sink_timeout) if node.log_sink else None
        self.node_log = node_log
        self.identity = identity
        self.node_config = node
        self.fabric_config = fabric or FabricConfig()
        self.registry_config = registry or RegistryConfig()
        self.engine = engine
        self.session_id = uuid.uuid4().hex
        self.admission = admission_from_config(self.fabric_config, identity)
        # In a closed network the join token names the provider; a different --provider-id would be refused.
        token_provider = self.admission.provider_id
        if token_provider and node.provider_id and node.provider_id != token_provider:
            raise ConfigError(
                f"the join token is for provider {token_provider!r}, not --provider-id {node.provider_id!r}"
            )
        self.provider_id = node.provider_id or token_provider or default_provider_id()
        self.log_dir = log_dir
        self.engine_log: Path | None = None
        self.host: Host | None = None
        self.registry: Registry | None = None
        self.gossip: Gossip | None = None
        self.membership: Membership | None = None
        self.housekeeping: Housekeeping | None = None
        self.supervisor: EngineSupervisor | None = None
        self.proxy = LocalEngineProxy(self._engine_url, max_body=node.max_body_bytes)
        self.exit_code: int | None = None
        self._stop = asyncio.Event()
        self._engine_ready = False
        self._tasks = TaskSet("node", on_error=self._task_failed)
        self._failures: dict[str, int] = {}
        self._closers: list[Any] = []
        self._found_private = False
        self._failing = False
        self._log_watch: asyncio.Task[Any] | None = None
        self.control = ControlService(
            node.controllers, node.accept_assignments == "any", self._assignment_busy, self.assign_engine
        )

    def __repr__(self) -> str:
        state = self.registry.local.lifecycle.name if self.registry else "new"
        return f"<NodeAgent {self.peer_id[-8:]} session={self.session_id[:8]} {state}>"

    # --- identity -----------------------------------------------------------------------------------------
    @property
    def peer_id(self) -> PeerId:
        """This node's peer id."""
        return self.identity.peer_id

    @property
    def listen_addrs(self) -> list[str]:
        """Bound fabric addresses."""
        return self.host.listen_addrs if self.host else []

    @property
    def bootstrap_addr(self) -> str:
        """An address others can pass to --bootstrap to join through this node."""
        record = self.registry.local if self.registry else None
        addr = record.addrs[0] if record and record.addrs else (self.listen_addrs or ["?"])[0]
        return f"{self.peer_id}@{addr}"

    def _engine_url(self) -> str | None:
        return self.engine.base_url if self.engine is not None and self._engine_ready else None

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> NodeAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Listen, register JOIN with our hardware, start gossip and liveness, bootstrap, launch the engine."""
        self.host = await Host.create(
            self.identity, self.node_config.listen, config=self.fabric_config, admission=self.admission
        )
        hardware = await asyncio.to_thread(probe_hardware)
        role = self.node_config.role
        roles = (role,) if role in ("ingress", "controller") else ("worker",)
        now = time.time()
        first = NodeRecord(
            session_id=self.session_id,
            peer_id=self.peer_id,
            provider_id=self.provider_id,
            lifecycle=Lifecycle.JOIN,
            version=1,
            # A private node has nothing to advertise until it holds relay slots.
            addrs=()
            if self.node_config.reachability == "private"
            else advertised_addrs(self.host.listen_addrs, self.node_config.advertise),
            relays=(),
            roles=roles,
            hardware=hardware,
            models=(),
            started_at=now,
            updated_at=now,
            signer=self.peer_id,
            reason="",
            signature=b"",
        ).signed(self.identity)
        self.registry = Registry(self.identity, first, config=self.registry_config, admission=self.admission)
        self.membership = Membership(self.host, self.registry, config=self.registry_config)
        self.gossip = Gossip(self.host, self.registry, self.membership, config=self.registry_config)
        self.housekeeping = Housekeeping(
            self.registry, config=self.registry_config, on_expired=lambda: self._rejoin("record expired")
        )
        self.registry.on_evicted(
            lambda before, eviction: asyncio.get_running_loop().call_soon(
                self._rejoin, f"evicted by {eviction.signer[-8:]}: {eviction.reason}"
            )
        )
        if self.node_config.trace_dir:
            self._trace_applies(Path(self.node_config.trace_dir))
        self.host.set_handler(PROTO_HTTP, self.proxy.handle_stream)
        if roles == ("worker",):
            self.host.set_handler(PROTO_CONTROL, self.control.handle_stream)
        await self.membership.start()
        await self.gossip.start()
        await self.housekeeping.start()
        logger.info(
            "node joined as JOIN",
            extra={"peer_id": self.peer_id, "session": self.session_id, "addrs": ",".join(first.addrs)},
        )
        if self.node_config.bootstrap:
            self._spawn(self._bootstrap(), "bootstrap")
        if self.engine is not None:
            self._launch_engine(assigned=False)

    def _launch_engine(self, assigned: bool) -> None:
        log_dir = self.log_dir or Path.cwd()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.engine_log = log_dir / f"engine-{self.session_id[:12]}.log"
        self._spawn(self._run_engine(assigned), "engine")

    # --- assignments from a fleet controller (/otela/control/1) ----------------------------------------------
    def _assignment_busy(self) -> str | None:
        """Why this node cannot take an assignment now, or None when it is idle."""
        if self.registry is None or self._stop.is_set() or self._failing:
            return "the node is stopping"
        if self.engine is not None:
            return f"the node already runs engine {self.engine.name}"
        if self.registry.local.lifecycle != Lifecycle.JOIN:
            return f"the node is {self.registry.local.lifecycle.name}, not idle"
        return None

    def assign_engine(self, assignment: EngineAssignment) -> None:
        """Start an assigned engine, as if the node had been started with it; the caller checked it is idle."""
        assert self.registry is not None
        self.engine = assignment.spec
        self.registry.update_local(
            reason=f"starting {assignment.model} for controller {assignment.controller}"[:512]
        )
        self._launch_engine(assigned=True)

    async def _assignment_failed(self, reason: str) -> None:
        """An assigned engine never served: stop it and go back to idle, saying why in our record."""
        assert self.registry is not None
        logger.error("assigned engine failed; the node is idle again: %s", reason)
        if self._log_watch is not None:
            self._log_watch.cancel()
            self._log_watch = None
        if self.supervisor is not None:
            await self.supervisor.stop(timeout=self.node_config.stop_timeout)
        self.supervisor, self.engine = None, None
        self.registry.update_local(reason=f"assignment failed: {reason}"[:512])

    def _rejoin(self, why: str) -> None:
        """Our session is gone from the mesh (evicted, or expired): carry on under a fresh session id."""
        assert self.registry is not None and self.membership is not None
        if self._stop.is_set():
            return
        before = self._last_own_record()
        if before.lifecycle > Lifecycle.SERVING:
            return
        now = time.time()
        session = uuid.uuid4().hex
        record = dataclasses.replace(
            before, session_id=session, version=1, started_at=now, updated_at=now, reason=""
        ).signed(self.identity)
        old = self.session_id
        self.session_id = session
        self.membership.restart(session)
        self.registry.start_session(record)
        logger.warning(
            "rejoined under a new session",
            extra={
                "old_session": old[:12],
                "session": session[:12],
                "why": why,
                "state": record.lifecycle.name,
            },
        )

    def _last_own_record(self) -> NodeRecord:
        """Our own latest record: the eviction replaced it in the map, but we remember what we last wrote."""
        assert self.registry is not None
        return self.registry.last_own or self.registry.local

    def _trace_applies(self, directory: Path) -> None:
        """Record when each change reached this replica: the convergence benchmark reads these lines."""
        directory.mkdir(parents=True, exist_ok=True)
        trace = open(directory / f"{self.session_id}.trace", "a", buffering=1)  # closed in aclose
        self._closers.append(trace.close)
        assert self.registry is not None

        def write(record: NodeRecord, local: bool) -> None:
            trace.write(
                f"{time.time():.6f} {record.session_id} {record.lifecycle.name} {record.version} {int(local)}\n"
            )

        write(self.registry.local, True)
        self.registry.on_change(write)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, name)

    def _task_failed(self, task: asyncio.Task[Any], exc: BaseException) -> None:
        # A node task that fails is a bug or a lost resource: stop with an error rather than limp on.
        log_task_error(task, exc)
        self.request_stop(1)

    async def _bootstrap(self) -> None:
        assert self.host is not None
        peers = await self.host.bootstrap(list(self.node_config.bootstrap))
        logger.info("bootstrapped", extra={"peers": ",".join(p[-8:] for p in peers)})
        if self.node_config.reachability == "auto" and peers:
            await self._detect_reachability(peers)
        if self.private:
            await self._reserve_relays()

    @property
    def private(self) -> bool:
        """Whether this node accepts no inbound connections and must be reached through relays."""
        return self.node_config.reachability == "private" or self._found_private

    async def _detect_reachability(self, peers: list[PeerId]) -> None:
        """Ask a bootstrap peer to dial our advertised addresses; if none answers, behave as a private node."""
        assert self.host is not None and self.registry is not None
        addrs = list(self.registry.local.addrs)
        for peer in peers:
            try:
                reachable = await self.host.check_reachable(peer, addrs)
            except OpenTelaError as exc:
                logger.info("reachability check through %s failed: %s", peer[-8:], exc)
                continue
            if reachable:
                logger.info("reachable from outside", extra={"addrs": ",".join(reachable)})
                if set(reachable) != set(addrs):
                    self.registry.update_local(addrs=tuple(a for a in addrs if a in reachable))
            else:
                logger.warning("no inbound connection reaches this node: switching to relays")
                self._found_private = True
            return

    async def _reserve_relays(self) -> None:
        """Hold relay slots on the bootstrap peers and advertise circuit addresses instead of our own."""
        assert self.host is not None and self.registry is not None
        relays: list[str] = []
        for addr in self.node_config.bootstrap:
            try:
                relay_peer = await self.host.reserve_relay(addr)
            except (OpenTelaError, ValueError) as exc:
                logger.warning("no relay slot at %s: %s", addr, exc)
                continue
            host, port, _ = parse_addr(addr)
            relays.append(f"{relay_peer}@{format_addr(host, port)}")
        if not relays:
            logger.error(
                "private node without any relay: peers cannot reach it until a bootstrap peer relays"
            )
            return
        self.registry.update_local(addrs=tuple(circuit_addr(r) for r in relays), relays=tuple(relays))
        logger.info("reachable through relays", extra={"relays": ",".join(relays)})

    async def _run_engine(self, assigned: bool = False) -> None:
        assert self.engine is not None and self.registry is not None and self.engine_log is not None
        self.supervisor = EngineSupervisor(
            self.engine, self.engine_log, ready_timeout=self.node_config.ready_timeout
        )
        try:
            await self.supervisor.start()
        except EngineCrashedError as exc:
            if assigned:
                await self._assignment_failed(f"engine could not start: {exc.message}")
                return
            await self.fail_stop(f"engine could not start: {exc.message}", EXIT_ENGINE_NOT_READY)
            return
        logger.info("engine started", extra={"pid": self.supervisor.pid, "log": str(self.engine_log)})
        log_watch = FatalLogWatch(
            self.engine_log, self.node_config.fatal_log_patterns, offset=self.supervisor.output_offset
        )
        if log_watch.patterns:
            # Watched from the start: an NCCL timeout while loading should not wait out the ready timeout.
            self._log_watch = self._spawn(self._watch_log(log_watch), "log-watch")
        try:
            served = await self.supervisor.wait_ready()
        except (EngineCrashedError, UpstreamTimeout) as exc:
            logger.error("engine never became ready: %s", exc)
            if assigned:
                await self._assignment_failed(f"engine not ready: {exc.message}")
                return
            await self.fail_stop(f"engine not ready: {exc.message}", EXIT_ENGINE_NOT_READY)
            return
        models = tuple(
            ModelEntry(id=str(m["id"]), engine=self.engine.name, settings=advertised_settings(m))
            for m in served
            if m.get("id")
        )
        self._engine_ready = True
        self.registry.update_local(lifecycle=Lifecycle.SERVING, models=models, reason="")
        logger.info("serving", extra={"models": ",".join(m.id for m in models)})
        if self.node_config.health_interval > 0:
            self._spawn(self._watch_health(), "health")
        code = await self.supervisor.wait_exit()
        self._engine_ready = False
        # A batch system signals the node and its engine together: let the node's own stop arrive first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), 0.5)
        if self._stop.is_set() or self._failing:
            return
        reason = f"engine exited with code {code}"
        fatal = log_watch.scan(final=True)
        if fatal is not None:
            reason += f" after a fatal log line: {fatal}"
        logger.error("%s; marking this node DOWN", reason, extra={"log": str(self.engine_log)})
        await self.fail_stop(reason, EXIT_ENGINE_DIED)

    async def _watch_log(self, watch: FatalLogWatch) -> None:
        line = await watch.watch()
        logger.error("fatal line in the engine log: %s", line, extra={"log": str(watch.path)})
        await self.fail_stop(f"fatal engine log line: {line}", EXIT_FATAL_LOG_LINE)

    async def _watch_health(self) -> None:
        assert self.engine is not None
        cfg = self.node_config
        url = self.engine.base_url + self.engine.health_path
        async with aiohttp.ClientSession() as http:
            reason = await watch_health(
                lambda: check_http(http, url, cfg.health_timeout),
                interval=cfg.health_interval,
                failures=cfg.health_failures,
                unhealthy_limit=cfg.unhealthy_limit,
            )
        logger.error("%s: fail-stop", reason, extra={"url": url})
        await self.fail_stop(reason, EXIT_ENGINE_UNHEALTHY)

    async def fail_stop(self, reason: str, code: int) -> None:
        """Stop on a fatal local condition: write DOWN, ship the log tail to the sink, and exit with `code`.

        The first fatal condition wins; later ones (the engine dying of what the log already said) are ignored.
        """
        if self._failing or self._stop.is_set():
            return
        self._failing = True
        self._engine_ready = False  # refuse new tunnelled requests at once
        try:
            await self._go_down(reason)
        except OpenTelaError as exc:
            logger.warning("could not announce DOWN: %s", exc)
        if self.log_sink is not None:
            await self.log_sink.ship(self.failure_report(reason, code))
        self.request_stop(code)

    def failure_report(self, reason: str, code: int) -> FailStopReport:
        """What this node says about itself when it fail-stops."""
        n = self.node_config.log_tail_lines
        engine_tail = self.supervisor.log_tail(n).splitlines() if self.supervisor and n > 0 else []
        return FailStopReport(
            peer_id=self.peer_id,
            session_id=self.session_id,
            provider_id=self.provider_id,
            hostname=socket.gethostname(),
            reason=reason,
            exit_code=code,
            engine=self.engine.name if self.engine else "",
            engine_log_path=str(self.engine_log or ""),
            engine_log=engine_tail,
            node_log=self.node_log.tail(n) if self.node_log is not None else [],
        )

    async def _go_down(self, reason: str) -> None:
        assert self.registry is not None and self.gossip is not None
        self.registry.update_local(lifecycle=Lifecycle.DOWN, reason=reason)
        await self.gossip.flush(timeout=2.0)

    def request_stop(self, code: int = EXIT_OK) -> None:
        """Ask the node to stop (signal handlers call this); the first code given wins."""
        if self.exit_code is None:
            self.exit_code = code
        self._stop.set()

    async def wait(self) -> int:
        """Block until the node is asked to stop or its engine dies; returns the process exit code."""
        await self._stop.wait()
        return self.exit_code or 0

    async def aclose(self) -> None:
        """Leave: write LEFT, tell peers, stop the engine, close the fabric."""
        self._stop.set()
        # A node that went DOWN (its engine died) has said so; LEFT is for an orderly leave.
        if (
            self.registry is not None
            and self.gossip is not None
            and self.registry.local.lifecycle < Lifecycle.DOWN
        ):
            with contextlib.suppress(OpenTelaError):
                self.registry.update_local(lifecycle=Lifecycle.LEFT, reason="shutdown")
                await self.gossip.flush(timeout=2.0)
        await self._tasks.aclose()
        if self.supervisor is not None:
            await self.supervisor.stop(timeout=self.node_config.stop_timeout)
        await self.proxy.aclose()
        if self.housekeeping is not None:
            await self.housekeeping.aclose()
        if self.gossip is not None:
            await self.gossip.aclose()
        if self.membership is not None:
            await self.membership.aclose()
        if self.host is not None:
            await self.host.aclose()
        for close in self._closers:
            close()

    # --- the Mesh contract the gateway reads ----------------------------------------------------------------
    def candidates(self, model: str) -> list[NodeRecord]:
        """SERVING replicas of `model` that are not suspected."""
        assert self.registry is not None and self.membership is not None
        excluded = self.membership.is_excluded
        return [r for r in self.registry.candidates(model) if not excluded(r)]

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        """SERVING records per model."""
        assert self.registry is not None
        return self.registry.model_replicas()

    def known_model_ids(self) -> set[str]:
        """Every model any record has served."""
        assert self.registry is not None
        return self.registry.known_models()

    def is_suspected(self, peer_id: PeerId) -> bool:
        """Local liveness verdict."""
        return self.membership is not None and self.membership.is_suspected(peer_id)

    async def open_http_stream(self, target: NodeRecord, timeout: float) -> Stream:
        """A tunnel stream to `target`; to ourselves it never leaves the process."""
        assert self.host is not None
        if target.session_id == self.session_id:
            ours, theirs = memory_stream_pair(PROTO_HTTP, self.peer_id, self.peer_id)
            self._spawn(self.proxy.handle_stream(theirs), "local-http")
            return ours
        return await self.host.open_stream(target.peer_id, PROTO_HTTP, addrs=target.addrs, timeout=timeout)

    def report_failure(self, target: NodeRecord, error: OpenTelaError) -> None:
        """Transport failures make the liveness layer look at the peer now rather than at its next probe."""
        self._failures[target.session_id] = self._failures.get(target.session_id, 0) + 1
        if self.membership is not None and error.code in (
            "peer_unreachable",
            "dial_timeout",
            "connection_closed",
        ):
            self.membership.suspect(target.peer_id, reason=error.code)

    def table(self) -> list[dict[str, Any]]:
        """Every record, JSON-ready."""
        assert self.registry is not None
        return self.registry.snapshot()

    def peers(self) -> list[dict[str, Any]]:
        """Connected and known peers with their liveness."""
        assert self.host is not None and self.membership is not None
        return self.membership.snapshot()

    def bootstraps(self) -> dict[str, Any]:
        """Configured bootstrap peers and our own joinable address."""
        return {"configured": list(self.node_config.bootstrap), "self": [self.bootstrap_addr]}

    def stats(self) -> dict[str, Any]:
        """Counters of every layer."""
        assert self.registry is not None and self.gossip is not None
        return {
            "registry": self.registry.stats(),
            "gossip": self.gossip.stats(),
            "membership": self.membership.stats() if self.membership is not None else {},
            "proxy": {"in_flight": self.proxy.in_flight, "served": self.proxy.served},
            "relay": self.host.relay.stats() if self.host is not None else {},
            "admission": {
                "network_id": self.admission.network_id or "open",
                "refused_peers": self.host.refused_not_member if self.host is not None else 0,
                "rejected_records": self.registry.counters["rejected_not_member"],
            },
            "failures_by_session": dict(self._failures),
            "control": dict(self.control.counters),
        }

    def health(self) -> dict[str, Any]:
        """Liveness of this node."""
        assert self.registry is not None
        local = self.registry.local
        return {
            "status": "ok" if local.lifecycle <= Lifecycle.SERVING else local.lifecycle.name.lower(),
            "peer_id": self.peer_id,
            "session_id": self.session_id,
            "state": local.lifecycle.name,
            "models": [m.id for m in local.models],
            "nodes_known": len(self.registry),
        }
