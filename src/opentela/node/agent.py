"""The node agent: joins the mesh, runs its engines, keeps this node's record true, serves tunnelled requests.

It composes parts that each have their own module: the fabric host, the registry replica with gossip and
liveness, `NodeReachability` (what the node advertises), one `EngineRunner` per engine, the `MeshView` the
gateway and the controller read, and the `ControlService` that takes assignments. What is left here is the
node's own life: its session, its record's lifecycle, fail-stop and leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opentela._tasks import TaskSet, log_task_error
from opentela._types import PROTO_BLOCKS, PROTO_CONTROL, PROTO_HTTP, Lifecycle, PeerId, Stream
from opentela.engines.base import EngineSpec
from opentela.engines.profile import PerformanceProfile
from opentela.errors import ConfigError, OpenTelaError
from opentela.fabric._config import FabricConfig
from opentela.fabric.admission import admission_from_config
from opentela.fabric.bootstrap import bootstrap
from opentela.fabric.connection_manager import BOOTSTRAP
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.model.threads import set_blas_threads
from opentela.node._config import NodeConfig, Role
from opentela.node.block_server import BlockServer
from opentela.node.control import ControlService, EngineAssignment, Refusal
from opentela.node.engine_runner import EXIT_OK, EngineRunner
from opentela.node.engine_set import EngineSet
from opentela.node.failstop import FailStop
from opentela.node.hardware import probe_hardware
from opentela.node.http_service import LocalEngineProxy
from opentela.node.join_watch import JoinWatch
from opentela.node.logsink import FailStopReport, LogSink, RecentLogs
from opentela.node.logwatch import compile_patterns
from opentela.node.mesh_view import MeshView
from opentela.node.notices import Notices
from opentela.node.reachability import NodeReachability
from opentela.node.session import (
    default_provider_id,
    join_record,
    new_session_id,
    resumed_record,
    trace_applies,
)
from opentela.registry._config import RegistryConfig
from opentela.registry.gossip import Gossip
from opentela.registry.housekeeping import Housekeeping
from opentela.registry.membership import Membership
from opentela.registry.overlay import Overlay
from opentela.registry.record import ModelEntry
from opentela.registry.registry import Registry

logger = logging.getLogger(__name__)
KEEP_ALIVE_CHECK_S = 0.25
"""How often a node looks for engines idle past their keep-alive."""


class NodeAgent:
    """One OpenTela node: fabric host, registry replica, gossip, liveness, and the engines it runs."""

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
        self.session_id = new_session_id()
        self.admission = admission_from_config(self.fabric_config, identity)
        # In a closed network the join token names the provider; a different --provider-id would be refused.
        token_provider = self.admission.provider_id
        if token_provider and node.provider_id and node.provider_id != token_provider:
            raise ConfigError(
                f"the join token is for provider {token_provider!r}, not --provider-id {node.provider_id!r}"
            )
        self.provider_id = node.provider_id or token_provider or default_provider_id()
        self.log_dir = log_dir
        self.host: Host | None = None
        self.registry: Registry | None = None
        self.gossip: Gossip | None = None
        self.membership: Membership | None = None
        self.overlay: Overlay | None = None
        """This node's partial view of the mesh (None when `active_view` is 0: everyone is a neighbour)."""
        self.housekeeping: Housekeeping | None = None
        self.reachability: NodeReachability | None = None
        self._mesh: MeshView | None = None
        self.blocks: BlockServer | None = None
        self.notices = Notices()
        """What the operator should act on: logged once at WARNING, served with health and stats."""
        self._join_watch: JoinWatch | None = None
        self.exit_code: int | None = None
        self._stop = asyncio.Event()
        self._tasks = TaskSet("node", on_error=self._task_failed)
        self.engines = EngineSet(lambda: self.log_dir or Path.cwd(), self._make_runner, self._tasks.spawn)
        self._configured_engine = engine  # launched by start()
        self.proxy = LocalEngineProxy(self.engines.serving_target, max_body=node.max_body_bytes)
        self._closers: list[Callable[[], None]] = []
        self._recycling = False
        self.fail_stop = FailStop(
            node,
            self.engines,
            identify=lambda: (self.peer_id, self.session_id, self.provider_id),
            go_down=self._go_down,
            request_stop=self.request_stop,
            stopping=self._stop.is_set,
            log_sink=self.log_sink,
            node_log=node_log,
        )
        """Call with a reason and an exit code to stop on a fatal local condition (the first one wins)."""
        self.control = ControlService(
            node.controllers,
            node.accept_assignments == "any",
            self._assignment_busy,
            self.assign_engine,
            self.stop_engine,
            self.assign_blocks,
        )

    def __repr__(self) -> str:
        state = self.registry.local.lifecycle.name if self.registry else "new"
        return f"<NodeAgent {self.peer_id[-8:]} session={self.session_id[:8]} {state} {self.engines!r}>"

    # --- identity and parts -------------------------------------------------------------------------------
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
        return self._mesh.bootstrap_addr if self._mesh else f"{self.peer_id}@?"

    @property
    def mesh(self) -> MeshView:
        """The running node's view of the mesh: what the gateway and the controller read."""
        if self._mesh is None:
            raise RuntimeError("the node is not started")
        return self._mesh

    @property
    def engine(self) -> EngineSpec | None:
        """The engine this node runs (the first, when it runs several), or None while idle."""
        runner = self.engines.first
        return runner.spec if runner is not None else self._configured_engine

    @property
    def engine_log(self) -> Path | None:
        """Where the (first) engine's output goes."""
        runner = self.engines.first
        return runner.log_path if runner is not None else None

    @property
    def private(self) -> bool:
        """Whether this node accepts no inbound connections and must be reached through relays."""
        return self.reachability is not None and self.reachability.private

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> NodeAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Listen, register JOIN with our hardware, start gossip and liveness, bootstrap, launch the engine."""
        cfg = self.node_config
        self.host = await Host.create(
            self.identity, cfg.listen, config=self.fabric_config, admission=self.admission
        )
        hardware = await asyncio.to_thread(probe_hardware)
        roles = (cfg.role.value,) if cfg.role in (Role.INGRESS, Role.CONTROLLER) else (Role.WORKER.value,)
        if roles == (Role.WORKER.value,):
            # Published so controllers can place engines beside each other (scheduler/serverless.py).
            hardware = {**hardware, "engine_memory_mib": lent_memory_mib(cfg.engine_memory_mib, hardware)}
        reachability = NodeReachability(cfg.reachability, self.host, cfg.bootstrap, self._update_record)
        addrs = reachability.initial_addrs(self.host.listen_addrs, cfg.advertise)
        first = join_record(
            self.identity, self.session_id, self.provider_id, addrs=addrs, roles=roles, hardware=hardware
        )
        self.reachability = reachability
        self.registry = Registry(self.identity, first, config=self.registry_config, admission=self.admission)
        if self.registry_config.active_view > 0:
            self.overlay = Overlay(self.host, self.registry, config=self.registry_config)
        self.membership = Membership(
            self.host, self.registry, config=self.registry_config, overlay=self.overlay
        )
        self.gossip = Gossip(
            self.host, self.registry, self.membership, config=self.registry_config, overlay=self.overlay
        )
        self.housekeeping = Housekeeping(
            self.registry, config=self.registry_config, on_expired=lambda: self._rejoin("record expired")
        )
        self._mesh = MeshView(
            self.host,
            self.registry,
            self.membership,
            self.gossip,
            self.proxy,
            self.control,
            bootstrap=cfg.bootstrap,
            spawn=self._tasks.spawn,
            notices=self.notices,
            overlay=self.overlay,
        )
        self._join_watch = JoinWatch(
            self.notices,
            ingress=cfg.role == Role.INGRESS,
            bootstrap=cfg.bootstrap,
            own_addr=lambda: self.bootstrap_addr,
            warn_after=cfg.bootstrap_warn_after,
            alone_after=cfg.no_peers_warn_after,
            now=time.monotonic(),
        )
        self.registry.on_evicted(
            lambda before, eviction: asyncio.get_running_loop().call_soon(
                self._rejoin, f"evicted by {eviction.signer[-8:]}: {eviction.reason}"
            )
        )
        if cfg.trace_dir:
            self._closers.append(trace_applies(self.registry, Path(cfg.trace_dir), self.session_id))
        self.host.set_handler(PROTO_HTTP, self.proxy.handle_stream, now=self.proxy.serve_now)
        if roles == (Role.WORKER.value,):
            self.host.set_handler(PROTO_CONTROL, self.control.handle_stream)
        await self.membership.start()
        await self.gossip.start()
        if self.overlay is not None:
            await self.overlay.start()
        await self.housekeeping.start()
        logger.info(
            "node joined as JOIN",
            extra={"peer_id": self.peer_id, "session": self.session_id, "addrs": ",".join(first.addrs)},
        )
        if cfg.bootstrap:
            self._tasks.spawn(self._bootstrap(), "bootstrap")
        self._tasks.spawn(self._watch_joining(self._join_watch), "join-watch")
        if cfg.blocks:
            self._start_blocks(*cfg.block_range())
        if self._configured_engine is not None:
            self.engines.launch(
                self._configured_engine, self.session_id, assigned=False, profile=self._engine_profile_id()
            )
            self._configured_engine = None

    def assign_blocks(self, model: str, start: int, end: int) -> Refusal | None:
        """A controller's block assignment: start serving blocks [start, end) of `model` on this idle node."""
        if self.blocks is not None or len(self.engines):
            return Refusal("busy", "this node already serves blocks or runs an engine")
        try:
            self._start_blocks(model, start, end)
        except ConfigError as exc:
            return Refusal("bad_request", str(exc))
        return None

    def _start_blocks(self, model: str, start: int, end: int) -> None:
        assert self.host is not None and self._mesh is not None
        self.blocks = self._block_server(model, start, end)
        self._mesh.blocks = self.blocks
        self.host.set_handler(PROTO_BLOCKS, self.blocks.handle_stream)
        self._tasks.spawn(self._serve_blocks(self.blocks), "blocks")

    def _block_server(self, model: str, start: int, end: int) -> BlockServer:
        """A block server for [start, end) of `model`, with its weights' file found."""
        cfg = self.node_config
        path = cfg.blocks_model_file
        if not path:
            from opentela.model.locate import SMOLLM2_ID, default_model_path

            if model != SMOLLM2_ID:
                raise ConfigError(f"[node] blocks of {model} need blocks_model_file (the model's GGUF file)")
            path = str(default_model_path())

        async def open_stream(peer: PeerId, addrs: tuple[str, ...], timeout: float) -> Stream:
            assert self.host is not None
            return await self.host.open_stream(peer, PROTO_BLOCKS, addrs=addrs, timeout=timeout)

        set_blas_threads(cfg.blocks_threads)
        return BlockServer(
            model,
            path,
            start,
            end,
            cache_bytes=cfg.blocks_cache_mib << 20,
            session_ttl_s=cfg.blocks_session_ttl,
            open_stream=open_stream,
        )

    async def _serve_blocks(self, server: BlockServer) -> None:
        """Load the blocks, then say in our record that we serve them."""
        await server.load()
        self._update_record(lifecycle=Lifecycle.SERVING, blocks=(server.span(),), reason="")

    def _engine_profile_id(self) -> str:
        """The id of the configured engine's performance profile ("" without one)."""
        path = self.node_config.engine_profile
        return PerformanceProfile.load(Path(path).expanduser()).profile_id if path else ""

    def _update_record(self, **changes: Any) -> None:
        assert self.registry is not None
        self.registry.update_local(**changes)

    async def _bootstrap(self) -> None:
        assert self.host is not None and self.registry is not None and self.reachability is not None
        assert self._join_watch is not None
        reached: dict[PeerId, str] = {}

        async def dial(addr: str) -> PeerId:
            peer = await self._dial_bootstrap(addr)
            reached[peer] = addr
            return peer

        peers = await bootstrap(dial, list(self.node_config.bootstrap))
        self._join_watch.bootstrap_done()
        logger.info("bootstrapped", extra={"peers": ",".join(p[-8:] for p in peers)})
        if self.overlay is not None and peers:
            # One contact walks us into a few active views; the others stay mere bootstrap peers.
            contact = random.choice(peers)
            self.overlay.join(contact, (reached[contact],))
            self._tasks.spawn(self._release_bootstraps(peers), "release-bootstraps")
        await self.reachability.settle(peers, self.registry.local.addrs)

    async def _release_bootstraps(self, peers: list[PeerId], patience: float = 30.0) -> None:
        """Once we have neighbours of our own, stop holding the bootstrap connections open: a bootstrap peer
        must not end up connected to every node (those that became neighbours stay protected as such)."""
        assert self.host is not None and self.overlay is not None
        neighbour = asyncio.Event()
        self.overlay.on_neighbour_up(lambda _peer: neighbour.set())
        if not self.overlay.active():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(neighbour.wait(), patience)
        for peer in peers:
            self.host.connections.unprotect(peer, BOOTSTRAP)

    async def _dial_bootstrap(self, addr: str) -> PeerId:
        """Dial one bootstrap address (kept connected, tag "bootstrap", until we have neighbours of our own),
        telling the join watch how it went."""
        assert self.host is not None and self._join_watch is not None
        try:
            peer = await self.host.connect(addr)
        except Exception as exc:
            self._join_watch.dialed(addr, exc, time.monotonic())
            raise
        self._join_watch.dialed(addr, peer, time.monotonic())
        self.host.connections.protect(peer, BOOTSTRAP)
        return peer

    async def _watch_joining(self, watch: JoinWatch) -> None:
        """Now and then, let the join watch see how many peers we have (its notices come and go with it)."""
        while not self._stop.is_set():
            has_engine = self.engines.first is not None or self._configured_engine is not None
            watch.observe(self.mesh.peer_count(), time.monotonic(), has_engine=has_engine)
            await asyncio.sleep(watch.check_interval)

    def _make_runner(self, spec: EngineSpec, log_path: Path, assigned: bool) -> EngineRunner:
        return EngineRunner(
            spec,
            log_path,
            self.node_config,
            stop=self._stop,
            on_serving=self._engine_serving,
            on_fatal=self.fail_stop,
            on_not_served=self._assignment_failed if assigned else None,
            on_task_error=self._task_failed,
            on_lost=self._shared_engine_lost,
            on_models=self._engine_models_changed,
        )

    def _engine_serving(self, runner: EngineRunner, models: tuple[ModelEntry, ...]) -> None:
        """An engine serves: the record lists the models of every engine that does."""
        assert self.registry is not None
        self.registry.update_local(
            lifecycle=Lifecycle.SERVING, models=self.engines.serving_models(), reason=""
        )
        logger.info("serving", extra={"models": ",".join(m.id for m in models)})

    def _engine_models_changed(self, runner: EngineRunner, models: tuple[ModelEntry, ...]) -> None:
        """A serving engine advertises new settings (a replica reconfiguring, or back): the record follows."""
        assert self.registry is not None
        if self.registry.local.lifecycle != Lifecycle.SERVING or self.fail_stop.failing:
            return  # a node going DOWN or LEFT keeps what it said last
        current = self.engines.serving_models()
        if current != self.registry.local.models:
            self.registry.update_local(models=current)

    # --- assignments from a fleet controller (/otela/control/1) ----------------------------------------------
    def _assignment_busy(self, assignment: EngineAssignment) -> Refusal | None:
        """Why this node cannot take `assignment` now, or None. An assignment with a memory footprint may join
        other engines that have one, within the node's engine memory; one without needs the node idle."""
        if self.registry is None or self._stop.is_set() or self.fail_stop.failing:
            return Refusal("busy", "the node is stopping")
        if self.blocks is not None:
            return Refusal("busy", f"the node serves blocks of {self.blocks.model}")
        if self.registry.local.lifecycle not in (Lifecycle.JOIN, Lifecycle.SERVING):
            return Refusal("busy", f"the node is {self.registry.local.lifecycle.name}, not idle")
        running = list(self.engines)
        if assignment.memory_mib is None or any(r.memory_mib is None for r in running):
            if running:
                return Refusal("busy", f"the node already runs engine {running[0].spec.name} on its own")
            return None
        if any(assignment.model in r.model_ids for r in running):
            return Refusal("busy", f"the node already runs {assignment.model}")
        budget = self.engine_memory_mib
        used = sum(r.memory_mib or 0 for r in running)
        if used + assignment.memory_mib > budget:
            return Refusal(
                "no_room",
                f"{assignment.model} needs {assignment.memory_mib} MiB; {used} of the node's {budget} MiB for "
                "engines are in use",
            )
        return None

    @property
    def engine_memory_mib(self) -> int:
        """The memory this node lends to engines (see NodeConfig.engine_memory_mib)."""
        hardware = self.registry.local.hardware if self.registry is not None else {}
        return lent_memory_mib(self.node_config.engine_memory_mib, hardware)

    def assign_engine(self, assignment: EngineAssignment) -> None:
        """Start an assigned engine, as if the node had been started with it; the caller checked there is room."""
        assert self.registry is not None
        self.registry.update_local(
            reason=f"starting {assignment.model} for controller {assignment.controller}"[:512]
        )
        self.engines.launch(
            assignment.spec,
            self.session_id,
            assigned=True,
            model=assignment.model,
            memory_mib=assignment.memory_mib,
            profile=assignment.profile,
            keep_alive_s=assignment.keep_alive_s,
        )
        if assignment.keep_alive_s is not None and not self._recycling:
            self._recycling = True
            self._tasks.spawn(self._recycle_idle_engines(), "keep-alive")

    def stop_engine(self, model: str, why: str = "stopped") -> bool:
        """Stop the engine serving `model` and take it off the record, leaving the others; False if none does."""
        runner = next((r for r in self.engines if model in r.model_ids), None)
        if runner is None:
            return False
        runner.retire()  # its exit is no failure of the node
        self.engines.forget(runner)
        logger.info("engine stopped", extra={"model": model, "why": why})
        if self.registry is not None:
            self.registry.update_local(models=self.engines.serving_models(), reason=f"{why}: {model}"[:512])
        self._tasks.spawn(runner.aclose(), f"stop-{model}"[:64])
        return True

    async def _shared_engine_lost(self, runner: EngineRunner, reason: str) -> None:
        """An engine sharing this node failed after serving: take it off the record, keep the others."""
        assert self.registry is not None
        self.engines.forget(runner)
        models = ",".join(sorted(runner.model_ids))
        self.registry.update_local(
            models=self.engines.serving_models(), reason=f"engine of {models} lost: {reason}"[:512]
        )
        self._tasks.spawn(runner.aclose(), f"stop-lost-{models}"[:64])

    async def _assignment_failed(self, runner: EngineRunner, reason: str) -> None:
        """An assigned engine never served (its runner stopped it): forget it and say why in our record."""
        assert self.registry is not None
        self.engines.forget(runner)
        self.registry.update_local(reason=f"assignment failed: {reason}"[:512])

    async def _recycle_idle_engines(self) -> None:
        """Stop each engine with a keep-alive once it has served nothing for that long (its memory goes back)."""
        while not self._stop.is_set():
            now = time.monotonic()
            for runner in self.engines:
                if runner.keep_alive_s is None or not runner.ready:
                    continue
                base = runner.spec.base_url
                if self.proxy.busy.get(base, 0) > 0:
                    continue
                idle = now - max(runner.ready_at, self.proxy.last_done.get(base, 0.0))
                if idle >= runner.keep_alive_s:
                    model = next(iter(sorted(runner.model_ids)), runner.spec.name)
                    self.stop_engine(model, f"idle for {idle:.1f} s (keep-alive {runner.keep_alive_s:g} s)")
            await asyncio.sleep(KEEP_ALIVE_CHECK_S)

    # --- sessions -------------------------------------------------------------------------------------------
    def _rejoin(self, why: str) -> None:
        """Our session is gone from the mesh (evicted, or expired): carry on under a fresh session id."""
        assert self.registry is not None and self.membership is not None
        if self._stop.is_set():
            return
        # The eviction replaced our record in the map, but we remember what we last wrote.
        before = self.registry.last_own or self.registry.local
        if before.lifecycle > Lifecycle.SERVING:
            return
        old, self.session_id = self.session_id, new_session_id()
        record = resumed_record(before, self.identity, self.session_id)
        self.membership.restart(self.session_id)
        self.registry.start_session(record)
        logger.warning(
            "rejoined under a new session",
            extra={
                "old_session": old[:12],
                "session": self.session_id[:12],
                "why": why,
                "state": record.lifecycle.name,
            },
        )

    def _task_failed(self, task: asyncio.Task[Any], exc: BaseException) -> None:
        # A node task that fails is a bug or a lost resource: stop with an error rather than limp on.
        log_task_error(task, exc)
        self.request_stop(1)

    # --- stopping ---------------------------------------------------------------------------------------------
    def failure_report(self, reason: str, code: int) -> FailStopReport:
        """What this node says about itself when it fail-stops."""
        return self.fail_stop.report(reason, code)

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
        """Leave: write LEFT, tell peers, stop the engines, close the fabric."""
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
        if self.blocks is not None:
            await self.blocks.aclose()
        await self.engines.aclose()
        await self.proxy.aclose()
        for part in (self.housekeeping, self.gossip, self.membership, self.overlay, self.host):
            if part is not None:
                await part.aclose()
        for close in self._closers:
            close()


def lent_memory_mib(configured: int, hardware: Mapping[str, Any]) -> int:
    """The memory a node lends its engines: as configured, else its GPUs' total, else its RAM."""
    if configured > 0:
        return configured
    gpus = hardware.get("gpus") or ()
    return sum(int(g.get("memory_mib", 0)) for g in gpus) or int(hardware.get("ram_mib", 0))
