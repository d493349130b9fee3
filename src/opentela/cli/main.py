"""The `otela` command line: start a node, run the demo, inspect a mesh, run an engine, plan placements."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from opentela import __version__
from opentela._logging import setup_logging
from opentela.errors import ConfigError, OpenTelaError


def _add_start_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file")
    p.add_argument("--bootstrap", action="append", metavar="ADDR", help="bootstrap peer (repeatable)")
    p.add_argument("--provider-id", metavar="ID", help="provider this node belongs to")
    p.add_argument("--listen", metavar="HOST:PORT", help="fabric listen address (default 0.0.0.0:0)")
    p.add_argument("--advertise", action="append", metavar="HOST:PORT", help="address peers should dial")
    p.add_argument(
        "--reachability",
        choices=["public", "private", "auto"],
        help="private: outbound connections only, reached through relay slots on the bootstrap peers; "
        "auto (default): a bootstrap peer dials us back, and we go private if it cannot",
    )
    p.add_argument("--key-file", metavar="PATH", help="Ed25519 identity key file")
    p.add_argument("--join-token", metavar="TOKEN", help="join token of a closed network (see otela network)")
    p.add_argument("--join-token-file", metavar="FILE", help="file holding the join token")
    p.add_argument("--network-id", metavar="ID", help="closed network this node must belong to (otn_...)")
    p.add_argument(
        "--ingress", action="store_true", help="also serve the OpenAI API (same as --role ingress)"
    )
    p.add_argument("--role", choices=["worker", "ingress"], help="node role")
    p.add_argument(
        "--controllers",
        action="append",
        metavar="PEERID",
        help="peer id of a fleet controller allowed to assign a model to this idle node (repeatable)",
    )
    p.add_argument(
        "--accept-assignments",
        choices=["listed", "any"],
        help="any: every peer may assign work here (local demos only); default listed: only --controllers",
    )
    p.add_argument(
        "--http", metavar="HOST:PORT", help="HTTP API listen address of an ingress (default 127.0.0.1:8092)"
    )
    p.add_argument(
        "--engine", metavar="NAME", help="engine shorthand when no command is given: embedded, simulated"
    )
    p.add_argument("--engine-port", type=int, metavar="PORT", help="port of the engine's OpenAI server")
    p.add_argument(
        "--process", metavar="CMD", help='engine command as one string, e.g. --process "vllm serve M"'
    )
    p.add_argument("--log-dir", metavar="DIR", help="directory for engine logs")
    p.add_argument(
        "--frontend",
        action="store_true",
        help="on an ingress, also run the API frontend (keys, usage, dashboard)",
    )
    p.add_argument(
        "--frontend-http", metavar="HOST:PORT", help="frontend listen address (default 127.0.0.1:8093)"
    )
    p.add_argument(
        "--db", metavar="URL", help="frontend database URL (default: SQLite in the data directory)"
    )
    p.add_argument("--max-body-bytes", type=int, metavar="N", help="largest request body accepted")
    p.add_argument("--log-sink", metavar="PATH|URL", help="where a fail-stop ships its log tail")
    p.add_argument("--health-interval", type=float, metavar="S", help="seconds between engine health checks")
    p.add_argument("--health-failures", type=int, metavar="N", help="failed checks in a row that fail-stop")
    p.add_argument("--unhealthy-limit", type=float, metavar="S", help="seconds unhealthy before fail-stop")
    p.add_argument(
        "--fatal-log-pattern", action="append", metavar="REGEX", help="engine log line that fail-stops"
    )
    p.add_argument(
        "--policy",
        metavar="NAME",
        help="ingress routing policy: random, round_robin, weighted, least_loaded, ...",
    )
    p.add_argument("--log-level", default=os.environ.get("OTELA_LOG_LEVEL", "INFO"), help="log level")
    p.add_argument(
        "--log-format", choices=["text", "json"], default=os.environ.get("OTELA_LOG_FORMAT", "text")
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- engine command serving the OpenAI API")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `otela`."""
    parser = argparse.ArgumentParser(
        prog="otela", description="OpenTela: one OpenAI endpoint over a mesh of nodes."
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    start = sub.add_parser("start", help="start a node (and its engine)", description="Start a node.")
    _add_start_flags(start)

    slurm = sub.add_parser(
        "slurm",
        help="write (and with --submit, submit) a Slurm job running a worker node",
        description="Write a batch script running `otela start [flags] -- ENGINE` in a Slurm job; "
        "every `otela start` flag given here is passed on.",
    )
    _add_start_flags(slurm)
    from opentela.cli import slurm as slurm_jobs

    slurm_jobs.add_arguments(slurm)

    demo = sub.add_parser("demo", help="a local mesh: an ingress and two embedded-engine workers")
    demo.add_argument("--once", action="store_true", help="send one chat request, print the answer, exit")
    demo.add_argument("--workers", type=int, default=2, help="number of worker nodes (default 2)")
    demo.add_argument("--http", default="127.0.0.1:8092", metavar="HOST:PORT", help="ingress HTTP address")
    demo.add_argument(
        "--frontend-http",
        metavar="HOST:PORT",
        help="API frontend and dashboard address (default 127.0.0.1:8093)",
    )
    demo.add_argument(
        "--threads", type=int, default=0, help="engine threads per worker (default: cores/workers)"
    )
    demo.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    demo.add_argument("--dir", metavar="DIR", help="where the demo keeps keys and logs (default: a temp dir)")
    demo.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the mesh to come up")

    frontend = sub.add_parser(
        "frontend", help="the API frontend: keys, limits, usage, dashboard, in front of an ingress"
    )
    frontend.add_argument("--ingress", metavar="URL", help="ingress base URL (default http://127.0.0.1:8092)")
    frontend.add_argument("--db", metavar="URL", help="database URL (default: SQLite in the data directory)")
    frontend.add_argument("--http", metavar="HOST:PORT", help="listen address (default 127.0.0.1:8093)")
    frontend.add_argument(
        "--admin-token", metavar="TOKEN", help="admin token (default: kept in the data directory)"
    )
    frontend.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file")
    frontend.add_argument("--log-level", default=os.environ.get("OTELA_LOG_LEVEL", "INFO"), help="log level")
    frontend.add_argument(
        "--log-format", choices=["text", "json"], default=os.environ.get("OTELA_LOG_FORMAT", "text")
    )

    from opentela.cli.keys import add_keys_arguments

    add_keys_arguments(
        sub.add_parser("keys", help="create, list, revoke, rotate API keys; usage; trace export")
    )

    status = sub.add_parser("status", help="print the mesh as seen by an ingress")
    status.add_argument("--ingress", default="http://127.0.0.1:8092", metavar="URL")
    status.add_argument("--json", action="store_true", help="print the raw table as JSON")

    engine = sub.add_parser("engine", help="run an engine in the foreground")
    esub = engine.add_subparsers(dest="engine_cmd", required=True, metavar="ENGINE")
    from opentela.engines import embedded, simulated_config

    emb = esub.add_parser("embedded", help="SmolLM2-135M-Instruct on llama.cpp (xllamacpp), CPU")
    embedded.add_arguments(emb)
    sim = esub.add_parser("simulated", help="a SIMULATED OpenAI server with configurable timing and failures")
    simulated_config.add_simulated_arguments(sim)

    from opentela.cli.network import add_network_parser

    add_network_parser(sub)
    from opentela.scheduler.commands import add_plan_arguments, add_simulate_arguments

    add_simulate_arguments(sub.add_parser("simulate", help="simulate serving a model on a device type"))
    add_plan_arguments(sub.add_parser("plan", help="place models on a cluster's idle devices (CP-SAT)"))

    from opentela.cli.controller import add_controller_arguments

    add_controller_arguments(
        sub.add_parser("controller", help="assign catalog models to idle nodes (fleet controller)")
    )

    bench = sub.add_parser("bench", help="measure an OpenAI-compatible endpoint")
    bsub = bench.add_subparsers(dest="bench_cmd", required=True, metavar="BENCHMARK")
    from opentela.bench import load as bench_load

    bench_load.add_arguments(
        bsub.add_parser("load", help="open-loop Poisson or trace-timed load with a JSON latency report")
    )

    sub.add_parser("version", help="print the version")
    cfg = sub.add_parser("config", help="configuration helpers")
    cfg_sub = cfg.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    cfg_sub.add_parser("reference", help="print the configuration reference (Markdown)")
    show = cfg_sub.add_parser("show", help="print the effective configuration")
    show.add_argument("--config", metavar="FILE")
    return parser


def _start_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
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
    frontend: dict[str, Any] = {}
    if args.frontend:
        frontend["enabled"] = True
    if args.frontend_http:
        frontend["http"] = args.frontend_http
    if args.db:
        frontend["db"] = args.db
    return {"node": node, "gateway": gateway, "fabric": fabric, "frontend": frontend}


def _engine_command(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.process:
        if command:
            raise ConfigError("give the engine command either after -- or with --process, not both")
        command = shlex.split(args.process)
    return command


def _run(coro: Any) -> int:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `otela` console script."""
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "version":
            print(f"otela {__version__}")
            return 0
        if args.cmd == "config":
            from opentela.config import load_config, reference_markdown

            if args.config_cmd == "reference":
                print(reference_markdown(), end="")
            else:
                print(load_config(args.config))
            return 0
        if args.cmd == "engine":
            setup_logging("INFO")
            if args.engine_cmd == "embedded":
                from opentela.engines.embedded import run_from_args

                run_from_args(args)
            else:
                from opentela.engines.simulated import run_simulated
                from opentela.engines.simulated_config import simulated_config_from_args

                run_simulated(simulated_config_from_args(args))
            return 0
        if args.cmd == "bench":
            from opentela.bench.load import run_from_args

            return run_from_args(args)
        if args.cmd in ("simulate", "plan"):
            from opentela.scheduler.commands import run

            return run(args)
        if args.cmd == "start":
            from opentela.cli.start import run_node
            from opentela.config import load_config

            setup_logging(args.log_level, args.log_format)
            config = load_config(args.config, flags=_start_flags(args))
            return _run(run_node(config, _engine_command(args)))
        if args.cmd == "slurm":
            from opentela.cli.slurm import run_slurm

            start_flags = argparse.ArgumentParser(add_help=False)
            _add_start_flags(start_flags)
            return run_slurm(args, start_flags)
        if args.cmd == "frontend":
            from opentela.cli.frontend import run_frontend
            from opentela.config import load_config

            setup_logging(args.log_level, args.log_format)
            flags = {
                "ingress": args.ingress,
                "db": args.db,
                "http": args.http,
                "admin_token": args.admin_token,
            }
            config = load_config(args.config, flags={"frontend": {k: v for k, v in flags.items() if v}})
            return _run(run_frontend(config))
        if args.cmd == "keys":
            from opentela.cli.frontend import frontend_db_url
            from opentela.cli.keys import run_keys
            from opentela.config import load_config

            config = load_config(args.config, flags={"frontend": {"db": args.db} if args.db else {}})
            return _run(run_keys(args, frontend_db_url(config)))
        if args.cmd == "controller":
            from opentela.cli.controller import run_controller

            setup_logging(
                os.environ.get("OTELA_LOG_LEVEL", "INFO"), os.environ.get("OTELA_LOG_FORMAT", "text")
            )
            return _run(run_controller(args))
        if args.cmd == "demo":
            from opentela.cli.demo import run_demo

            setup_logging("WARNING")
            return _run(run_demo(args))
        if args.cmd == "network":
            from opentela.cli.network import run_network

            return run_network(args)
        if args.cmd == "status":
            from opentela.cli.status import print_status

            return _run(print_status(args.ingress, as_json=args.json))
    except (ConfigError, OpenTelaError) as exc:
        print(f"otela: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


__all__ = ["build_parser", "main"]
