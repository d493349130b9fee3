"""`otela frontend` and `otela start --ingress --frontend`: compose the frontend from the configuration."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentela._logging import setup_logging
from opentela._signals import on_stop_signals
from opentela.cli._process import add_log_arguments, log_flags, run_async
from opentela.config import OtelaConfig, data_home, load_config
from opentela.errors import ConfigError
from opentela.fabric.addresses import parse_addr

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
    parser.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="an origin (https://app.example.org, or *) whose browser pages may call the API (repeatable; "
        "default *)",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file")
    add_oidc_arguments(parser.add_argument)
    add_log_arguments(parser)


def add_oidc_arguments(add: Callable[..., object]) -> None:
    """The login flags (`otela frontend`, `otela start --frontend`), added with `add` (a parser's add_argument).

    The client secret has a file flag only: a secret given on the command line shows up in process lists, so it
    comes from a file, OTELA_FRONTEND_OIDC_CLIENT_SECRET or the configuration file.
    """
    add("--oidc-issuer", metavar="URL", help="issuer URL of the OpenID Connect provider users log in with")
    add("--oidc-client-id", metavar="ID", help="client id this frontend is registered under at the provider")
    add(
        "--oidc-client-secret-file",
        metavar="FILE",
        help="file holding the client secret of a confidential client (default: a public client, PKCE only)",
    )
    add(
        "--oidc-redirect-url",
        metavar="URL",
        help="callback URL registered at the provider, https://HOST/auth/callback (behind a reverse proxy)",
    )
    add(
        "--oidc-allowed-domain",
        action="append",
        metavar="DOMAIN",
        help="email domain admitted (repeatable; with neither domains nor groups, every account)",
    )
    add("--oidc-allowed-group", action="append", metavar="GROUP", help="group admitted (repeatable)")


def oidc_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The [frontend] login settings given as flags, the client secret read from its file."""
    out: dict[str, Any] = {
        k: v for k in ("oidc_issuer", "oidc_client_id", "oidc_redirect_url") if (v := getattr(args, k))
    }
    if args.oidc_client_secret_file:
        try:
            secret = Path(args.oidc_client_secret_file).read_text().strip()
        except OSError as exc:
            # Without the path: argparse takes `--oidc-client-secret VALUE` for this flag, VALUE being a secret.
            raise ConfigError(f"cannot read the OIDC client secret file: {exc.strerror}") from None
        if not secret:
            raise ConfigError("the OIDC client secret file is empty")
        out["oidc_client_secret"] = secret
    if args.oidc_allowed_domain:
        out["oidc_allowed_domains"] = tuple(args.oidc_allowed_domain)
    if args.oidc_allowed_group:
        out["oidc_allowed_groups"] = tuple(args.oidc_allowed_group)
    return out


def config_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings given as `otela frontend` flags, by configuration section (for `load_config(flags=...)`)."""
    flags = {"ingress": args.ingress, "db": args.db, "http": args.http, "admin_token": args.admin_token}
    frontend = {k: v for k, v in flags.items() if v} | oidc_flags(args)
    if args.cors_origin:
        frontend["cors_origins"] = tuple(args.cors_origin)
    return {"frontend": frontend, "log": log_flags(args)}


def run(args: argparse.Namespace) -> int:
    """`otela frontend`: serve the frontend in front of an ingress until SIGINT/SIGTERM."""
    config = load_config(args.config, flags=config_flags(args))
    setup_logging(config.log)
    return run_async(run_frontend(config))


def frontend_db_url(config: OtelaConfig) -> str:
    """The configured database, else a SQLite file in the data directory."""
    from opentela.frontend.db import sqlite_url  # SQLAlchemy: only when a frontend runs

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
