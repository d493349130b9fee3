"""`otela start`: compose a node agent, its engine and (on an ingress) the gateway, and run until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from opentela.config import OtelaConfig, config_home, state_home
from opentela.engines._registry import engine_from_command, engine_from_name
from opentela.engines.base import EngineSpec
from opentela.errors import ConfigError
from opentela.fabric.addresses import parse_addr
from opentela.fabric.identity import Identity
from opentela.gateway.app import Gateway
from opentela.node.agent import NodeAgent
from opentela.node.logsink import RecentLogs

logger = logging.getLogger(__name__)


def resolve_engine(config: OtelaConfig, command: list[str]) -> EngineSpec | None:
    """The engine to supervise: an explicit command, else the --engine shorthand, else none (JOIN only)."""
    node = config.node
    port = node.engine_port or None
    if command:
        if node.engine:
            raise ConfigError("give either an engine command or --engine, not both")
        return engine_from_command(command, port=port)
    if node.engine:
        return engine_from_name(node.engine, port=port)
    return None


async def run_node(config: OtelaConfig, command: list[str]) -> int:
    """Run one node until SIGINT/SIGTERM or until its engine dies; returns the exit code."""
    node = config.node
    if node.role not in ("worker", "ingress"):
        raise ConfigError(f"role must be worker or ingress, not {node.role!r}")
    identity = Identity.load_or_create(node.key_file or config_home() / "identity.key")
    engine = resolve_engine(config, command)
    log_dir = Path(node.log_dir) if node.log_dir else state_home() / "logs"
    fabric = config.fabric
    if node.reachability == "private":
        fabric = dataclasses.replace(fabric, relay_serve=False)  # nobody can dial us, so we relay for nobody
    # The node's own recent log goes into a fail-stop report beside the engine's.
    node_log = RecentLogs(capacity=max(node.log_tail_lines, 1))
    root = logging.getLogger()
    if root.handlers:
        node_log.setFormatter(root.handlers[0].formatter)
    agent = NodeAgent(
        identity, node, fabric, config.registry, engine=engine, log_dir=log_dir, node_log=node_log
    )
    root.addHandler(node_log)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.request_stop, 0)
    gateway: Gateway | None = None
    frontend: Any = None
    try:
        await agent.start()
        print(f"node      {agent.peer_id}", file=sys.stderr)
        print(f"session   {agent.session_id}", file=sys.stderr)
        print(f"provider  {agent.provider_id}", file=sys.stderr)
        print(f"bootstrap {agent.bootstrap_addr}", file=sys.stderr)
        if engine is not None:
            print(f"engine    {engine.name} on {engine.base_url}: {' '.join(engine.argv)}", file=sys.stderr)
        else:
            print("engine    none: joined with hardware only, waiting to be assigned work", file=sys.stderr)
        if node.role == "ingress":
            host, port, _ = parse_addr(config.gateway.http)
            gateway = Gateway(agent.mesh, config.gateway)
            url = await gateway.start(host, port)
            print(f"api       {url}/v1", file=sys.stderr)
            if config.frontend.enabled:
                from opentela.cli.frontend import print_frontend, start_frontend

                frontend = await start_frontend(config, ingress_url=url)
                print_frontend(frontend, config)
        elif config.frontend.enabled:
            raise ConfigError("--frontend runs inside an ingress node: add --ingress")
        if agent.engine_log is not None:
            print(f"log       {agent.engine_log}", file=sys.stderr)
        if agent.log_sink is not None:
            print(f"log sink  {agent.log_sink.url or agent.log_sink.path} (on fail-stop)", file=sys.stderr)
        sys.stderr.flush()
        return await agent.wait()
    finally:
        # The handlers stay while the node leaves: a batch system often sends SIGTERM twice (to every process
        # of the job, and through the job's shell), and the second must not cut the LEFT announcement short.
        try:
            if frontend is not None:
                await frontend.aclose()
            if gateway is not None:
                await gateway.aclose()
            await agent.aclose()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            root.removeHandler(node_log)
