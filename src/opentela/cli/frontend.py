"""`otela frontend` and `otela start --ingress --frontend`: compose the frontend from the configuration."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import socket
import sys
from typing import TYPE_CHECKING

from opentela._logging import setup_logging
from opentela._signals import on_stop_signals
from opentela.cli._process import add_log_arguments, log_flags, run_async
from opentela.config import OtelaConfig, data_home, load_config
from opentela.fabric.addresses import parse_addr
from opentela.frontend.db import sqlite_url

if TYPE_CHECKING:
    from opentela.frontend import Frontend
    from opentela.gateway.state import GatewayState

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `otela frontend`."""
    parser.add_argument("--ingress", metavar="URL", help="ingress base URL (default http://127.0.0.1:8092)")
    parser.add_argument("--db", metavar="URL", help="database URL (default: SQLite in the data directory)")
    parser.add_argument("--http", metavar="HOST:PORT", help="listen address (default 127.0.0.1:8093)")
    parser.add_argument(
        "--admin-token", metavar="TOKEN", help="admin token (default: kept in the data directory)"
    )
    parser.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file")
    add_log_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """`otela frontend`: serve the frontend in front of an ingress until SIGINT/SIGTERM."""
    flags = {"ingress": args.ingress, "db": args.db, "http": args.http, "admin_token": args.admin_token}
    config = load_config(
        args.config, flags={"frontend": {k: v for k, v in flags.items() if v}, "log": log_flags(args)}
    )
    setup_logging(config.log)
    return run_async(run_frontend(config))


def frontend_db_url(config: OtelaConfig) -> str:
    """The configured database, else a SQLite file in the data directory."""
    return config.frontend.db or sqlite_url(data_home() / "frontend.db")


def frontend_admin_token(config: OtelaConfig) -> str:
    """The configured admin token, else the one kept (or created) in the data directory."""
    from opentela.frontend import load_or_create_admin_token

    return config.frontend.admin_token or load_or_create_admin_token(data_home() / "admin-token")


async def start_frontend(
    config: OtelaConfig, ingress_url: str | None = None, gateway: GatewayState | None = None
) -> Frontend:
    """Create the frontend (database migrated, pending rows reconciled) and start listening; given the `gateway`
    of this process, it forwards to it in-process."""
    from opentela.frontend import Frontend

    # Migration steps and uvicorn's start banner are noise next to our own start-up lines.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    fc = config.frontend
    if ingress_url:
        fc = dataclasses.replace(fc, ingress=ingress_url)
    host, port, _ = parse_addr(fc.http)
    instance = fc.instance or f"{socket.gethostname()}:{port}"
    frontend = await Frontend.create(
        fc,
        db_url=frontend_db_url(config),
        admin_token=frontend_admin_token(config),
        instance=instance,
        gateway=gateway,
    )
    try:
        await frontend.start(host, port)
    except BaseException:
        await frontend.aclose()
        raise
    return frontend


def print_frontend(frontend: Frontend, config: OtelaConfig) -> None:
    """Where the frontend is and how to manage it."""
    where = "configured" if config.frontend.admin_token else f"in {data_home() / 'admin-token'}"
    print(
        f"frontend  {frontend.url}/ (dashboard), {frontend.url}/v1 (API), {frontend.url}/docs",
        file=sys.stderr,
    )
    if frontend.in_process:
        print("          requests go to this node's gateway in-process", file=sys.stderr)
    decided = "in memory" if frontend.state.ledger.local is not None else "through the database"
    print(f"database  {frontend.state.db!r}, limits decided {decided}", file=sys.stderr)
    print(f"admin     token {where}; create a key with `otela keys create --name NAME`", file=sys.stderr)
    sys.stderr.flush()


async def run_frontend(config: OtelaConfig) -> int:
    """Serve the frontend until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    restore_signals = on_stop_signals(stop.set)
    frontend: Frontend | None = None
    try:
        frontend = await start_frontend(config)
        print_frontend(frontend, config)
        print(f"ingress   {frontend.state.ingress.base_url}", file=sys.stderr)
        sys.stderr.flush()
        await stop.wait()
        return 0
    finally:
        restore_signals()
        if frontend is not None:
            await frontend.aclose()
