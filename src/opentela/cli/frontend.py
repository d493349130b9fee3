"""`otela frontend` and `otela start --ingress --frontend`: compose the frontend from the configuration."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
from typing import TYPE_CHECKING

from opentela.config import OtelaConfig, data_home
from opentela.fabric.addresses import parse_addr
from opentela.frontend.db import sqlite_url

if TYPE_CHECKING:
    from opentela.frontend import Frontend

logger = logging.getLogger(__name__)


def frontend_db_url(config: OtelaConfig) -> str:
    """The configured database, else a SQLite file in the data directory."""
    return config.frontend.db or sqlite_url(data_home() / "frontend.db")


def frontend_admin_token(config: OtelaConfig) -> str:
    """The configured admin token, else the one kept (or created) in the data directory."""
    from opentela.frontend import load_or_create_admin_token

    return config.frontend.admin_token or load_or_create_admin_token(data_home() / "admin-token")


async def start_frontend(config: OtelaConfig, ingress_url: str | None = None) -> Frontend:
    """Create the frontend (database migrated, pending rows reconciled) and start listening."""
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
        fc, db_url=frontend_db_url(config), admin_token=frontend_admin_token(config), instance=instance
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
    print(f"database  {frontend.state.db!r}", file=sys.stderr)
    print(f"admin     token {where}; create a key with `otela keys create --name NAME`", file=sys.stderr)
    sys.stderr.flush()


async def run_frontend(config: OtelaConfig) -> int:
    """Serve the frontend until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    frontend = await start_frontend(config)
    try:
        print_frontend(frontend, config)
        print(f"ingress   {frontend.state.ingress.base_url}", file=sys.stderr)
        sys.stderr.flush()
        await stop.wait()
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await frontend.aclose()
