"""`otela start`: compose a node agent, its engine and (on an ingress) the gateway, and run until stopped."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from opentela._logging import setup_logging
from opentela._signals import on_stop_signals
from opentela.cli._process import add_log_arguments, log_flags, run_async
from opentela.cli.frontend import add_oidc_arguments, oidc_flags
from opentela.config import OtelaConfig, config_home, load_config, state_home
from opentela.engines._registry import engine_from_command, engine_from_name
from opentela.engines.base import EngineSpec
from opentela.errors import ConfigError
from opentela.fabric.addresses import parse_addr
from opentela.fabric.key_claim import ClaimedKey, claim_explicit, claim_key, owner_tag
from opentela.gateway.app import Gateway
from opentela.node.agent import NodeAgent
from opentela.node.logsink import RecentLogs

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add the flags of `otela start`; returns the options among them (what `otela slurm` passes on)."""
    p.description = "Start a node."
    options: list[argparse.Action] = []

    def option(*names: str, **kwargs: Any) -> None:
        options.append(p.add_argument(*names, **kwargs))

    option("--config", metavar="FILE", help="TOML or YAML configuration file")
    option("--bootstrap", action="append", metavar="ADDR", help="bootstrap peer (repeatable)")
    option("--provider-id", metavar="ID", help="provider this node belongs to")
    option("--listen", metavar="HOST:PORT", help="fabric listen address (default 0.0.0.0:0)")
    option("--advertise", action="append", metavar="HOST:PORT", help="address peers should dial")
    option(
        "--reachability",
        choices=["public", "private", "auto"],
        help="private: outbound connections only, reached through relay slots on the bootstrap peers; "
        "auto (default): a bootstrap peer dials us back, and we go private if it cannot",
    )
    option("--key-file", metavar="PATH", help="Ed25519 identity key file")
    option("--join-token", metavar="TOKEN", help="join token of a closed network (see otela network)")
    option("--join-token-file", metavar="FILE", help="file holding the join token")
    option("--network-id", metavar="ID", help="closed network this node must belong to (otn_...)")
    option("--ingress", action="store_true", help="also serve the OpenAI API (same as --role ingress)")
    option("--role", choices=["worker", "ingress"], help="node role")
    option(
        "--controllers",
        action="append",
        metavar="PEERID",
        help="peer id of a fleet controller allowed to assign a model to this idle node (repeatable)",
    )
    option(
        "--accept-assignments",
        choices=["listed", "any"],
        help="any: every peer may assign work here (local demos only); default listed: only --controllers",
    )
    option(
        "--http", metavar="HOST:PORT", help="HTTP API listen address of an ingress (default 127.0.0.1:8092)"
    )
    option("--engine", metavar="NAME", help="engine shorthand when no command is given: embedded, simulated")
    option("--engine-port", type=int, metavar="PORT", help="port of the engine's OpenAI server")
    option("--engine-profile", metavar="FILE", help="performance profile of the engine (see otela profile)")
    option(
        "--blocks",
        metavar="MODEL:START-END",
        help="serve decoder blocks [START, END) of a split model, e.g. SmolLM2-135M-Instruct:0-10",
    )
    option(
        "--blocks-model-file",
        metavar="GGUF",
        help="weights of the split model (default: the shipped SmolLM2)",
    )
    option("--process", metavar="CMD", help='engine command as one string, e.g. --process "vllm serve M"')
    option("--log-dir", metavar="DIR", help="directory for engine logs")
    option(
        "--frontend",
        action="store_true",
        help="on an ingress, also run the API frontend (keys, usage, dashboard)",
    )
    option("--frontend-http", metavar="HOST:PORT", help="frontend listen address (default 127.0.0.1:8093)")
    option("--db", metavar="URL", help="frontend database URL (default: SQLite in the data directory)")
    add_oidc_arguments(option)
    option("--max-body-bytes", type=int, metavar="N", help="largest request body accepted")
    option("--log-sink", metavar="PATH|URL", help="where a fail-stop ships its log tail")
    option("--health-interval", type=float, metavar="S", help="seconds between engine health checks")
    option("--health-failures", type=int, metavar="N", help="failed checks in a row that fail-stop")
    option("--unhealthy-limit", type=float, metavar="S", help="seconds unhealthy before fail-stop")
    option("--fatal-log-pattern", action="append", metavar="REGEX", help="engine log line that fail-stops")
    option(
        "--policy",
        metavar="NAME",
        help="ingress routing policy: random, round_robin, weighted, least_loaded, ...",
    )
    option(
        "--model-alias",
        action="append",
        metavar="ALIAS=ID",
        help="on an ingress, let requests name model ID as ALIAS (repeatable)",
    )
    option(
        "--default-model",
        metavar="NAME",
        help="on an ingress, the model (an id or an alias) of requests that name none",
    )
    option(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="on an ingress, an origin (https://app.example.org, or *) whose browser pages may call the API "
        "(repeatable; default none: CORS off)",
    )
    options += add_log_arguments(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- engine command serving the OpenAI API")
    return options


def config_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings given as `otela start` flags, by configuration section (for `load_config(flags=...)`)."""
    node: dict[str, Any] = {}
    gateway: dict[str, Any] = {}
    for name in (
        "provider_id",
        "listen",
        "key_file",
        "engine",
        "engine_port",
        "log_dir",
        "max_body_bytes",
        "reachability",
        "log_sink",
        "health_interval",
        "health_failures",
        "unhealthy_limit",
        "accept_assignments",
        "engine_profile",
        "blocks",
        "blocks_model_file",
    ):
        value = getattr(args, name)
        if value is not None:
            node[name] = value
    if args.bootstrap:
        node["bootstrap"] = tuple(args.bootstrap)
    if args.advertise:
        node["advertise"] = tuple(args.advertise)
    if args.controllers:
        node["controllers"] = tuple(args.controllers)
    if args.fatal_log_pattern:
        node["fatal_log_patterns"] = tuple(args.fatal_log_pattern)
    if args.ingress or args.role:
        node["role"] = "ingress" if args.ingress else args.role
    fabric = {k: v for k in ("join_token", "join_token_file", "network_id") if (v := getattr(args, k))}
    if args.http:
        gateway["http"] = args.http
    if args.max_body_bytes is not None:
        gateway["max_body_bytes"] = args.max_body_bytes
    if args.policy:
        gateway["policy"] = args.policy
    if args.model_alias:
        gateway["model_aliases"] = tuple(args.model_alias)
    if args.default_model:
        gateway["default_model"] = args.default_model
    if args.cors_origin:
        gateway["cors_origins"] = tuple(args.cors_origin)
    frontend: dict[str, Any] = {}
    if args.frontend:
        frontend["enabled"] = True
    if args.frontend_http:
        frontend["http"] = args.frontend_http
    if args.db:
        frontend["db"] = args.db
    frontend |= oidc_flags(args)
    return {"node": node, "gateway": gateway, "fabric": fabric, "frontend": frontend, "log": log_flags(args)}


def engine_command(args: argparse.Namespace) -> list[str]:
    """The engine command after `--`, or the one given with --process (not both)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.process:
        if command:
            raise ConfigError("give the engine command either after -- or with --process, not both")
        command = shlex.split(args.process)
    return command


def run(args: argparse.Namespace) -> int:
    """`otela start`: load the configuration (files, OTELA_* variables, flags) and run the node."""
    config = load_config(args.config, flags=config_flags(args))
    setup_logging(config.log)
    return run_async(run_node(config, engine_command(args)))


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


def claim_node_key(config: OtelaConfig, command: list[str]) -> ClaimedKey:
    """This node's identity: the key given with --key-file, else a free key of the configuration directory.

    Nodes started with the same settings prefer the key such a node used last, so a restarted node keeps its peer
    id; two running at once get two keys (docs/node.md, "Identity").
    """
    node = config.node
    if node.key_file:
        return claim_explicit(Path(node.key_file))
    owner = owner_tag(node.role, node.listen, config.gateway.http, node.provider_id, node.engine, *command)
    return claim_key(config_home(), owner)


async def run_node(config: OtelaConfig, command: list[str]) -> int:
    """Run one node until SIGINT/SIGTERM or until its engine dies; returns the exit code."""
    node = config.node
    if node.role not in ("worker", "ingress"):
        raise ConfigError(f"role must be worker or ingress, not {node.role!r}")
    key = claim_node_key(config, command)
    identity = key.identity
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
    restore_signals = on_stop_signals(agent.request_stop, 0)
    gateway: Gateway | None = None
    frontend: Any = None
    try:
        # The imported modules (most of the ~73,000 objects an ingress tracks) out of the collector's reach
        # (a full pass over them takes 12 ms, a stall of whatever request is in flight), collected first, while
        # nothing is: the node has not started yet.
        gc.collect()
        gc.freeze()
        await agent.start()
        print(f"node      {agent.peer_id}", file=sys.stderr)
        print(f"session   {agent.session_id}", file=sys.stderr)
        print(f"provider  {agent.provider_id}", file=sys.stderr)
        print(
            f"key       {key.path}{' (shared with another running node)' if key.shared else ''}",
            file=sys.stderr,
        )
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

                frontend = await start_frontend(config, ingress_url=url, gateway=gateway.state)
                print_frontend(frontend, config)
        elif config.frontend.enabled:
            raise ConfigError("--frontend runs inside an ingress node: add --ingress")
        if agent.engine_log is not None:
            print(f"log       {agent.engine_log}", file=sys.stderr)
        if agent.log_sink is not None:
            print(f"log sink  {agent.log_sink.url or agent.log_sink.path} (on fail-stop)", file=sys.stderr)
        sys.stderr.flush()
        # What start-up built lives as long as the process: moved out of the collector's generations, no
        # collection walks it again. Only a freeze here, which costs nothing: a collection now would stall the
        # join under way (22 ms on a 2-core VM, most of a join's first hop); the modules were collected and
        # frozen before the node started.
        gc.freeze()
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
            restore_signals()
            root.removeHandler(node_log)
            key.release()
