"""`otela network`: create a closed network's key, issue join tokens for providers, decode a token."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

from opentela.config import config_home
from opentela.errors import ConfigError
from opentela.fabric.join_tokens import (
    JoinToken,
    create_network_key,
    load_network_key,
    network_id_of,
)

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def default_key_path() -> Path:
    """Where `init` writes and `issue` reads the network key unless told otherwise."""
    return config_home() / "network.key"


def parse_expiry(text: str, now: float | None = None) -> int:
    """Unix seconds for `30d`, `12h`, `90m`, `2w`, an ISO date/time (UTC unless it says), or 0 for `never`."""
    now = time.time() if now is None else now
    text = text.strip()
    if text.lower() == "never":
        return 0
    match = _DURATION.match(text)
    if match:
        seconds = int(match.group(1)) * _UNIT[match.group(2)]
        if seconds <= 0:
            raise ConfigError("--expires must be in the future")
        return int(now + seconds)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--expires: {text!r} is not a duration (30d, 12h), an ISO time or 'never'"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    expires = int(when.timestamp())
    if expires <= now:
        raise ConfigError(f"--expires {text} is in the past")
    return expires


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600, also when the file existed), never via a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # O_CREAT's mode applies only to a new file
        f.write(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The actions of `otela network`."""
    actions = parser.add_subparsers(dest="network_cmd", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="create a network key (prints the network id)")
    init.add_argument("--out", metavar="FILE", help=f"key file to create (default {default_key_path()})")
    issue = actions.add_parser(
        "issue",
        help="issue a join token for a provider (prints it; --out FILE writes it readable by you only)",
        description="Issue a join token. A token admits its holder to the network: prefer --out FILE, which "
        "creates the file with mode 0600, over redirecting standard output (the shell creates that file "
        "readable by everyone, 0644 under the usual umask).",
    )
    issue.add_argument("--key", metavar="FILE", help=f"network key file (default {default_key_path()})")
    issue.add_argument("--provider", required=True, metavar="ID", help="provider id the token admits")
    issue.add_argument(
        "--expires", default="30d", metavar="WHEN", help="30d, 12h, an ISO time, or never (default 30d)"
    )
    issue.add_argument(
        "--out", metavar="FILE", help="write the token to FILE (mode 0600) instead of standard output"
    )
    show = actions.add_parser("show-token", help="decode and verify a join token (never prints its secret)")
    show.add_argument("token", metavar="TOKEN", help="the token, or - to read it from standard input")


def run(args: argparse.Namespace) -> int:
    """Run one `otela network` action; ConfigError for bad input."""
    if args.network_cmd == "init":
        path = Path(args.out) if args.out else default_key_path()
        key = create_network_key(path)
        network_id = network_id_of(key.public_key().public_bytes_raw())
        print(f"network key written to {path} (keep it secret; it issues join tokens)", file=sys.stderr)
        print(network_id)
        return 0
    if args.network_cmd == "issue":
        key = load_network_key(Path(args.key) if args.key else default_key_path())
        token = JoinToken.issue(key, args.provider, expires_at=parse_expiry(args.expires))
        claims = token.grant.describe()
        print(
            f"join token for provider {claims['provider_id']!r} on network {claims['network_id']}, "
            f"expires {claims['expires_at']}, token id {claims['token_id']}",
            file=sys.stderr,
        )
        if args.out:
            write_secret(Path(args.out), token.encode() + "\n")
            print(f"token written to {args.out} (mode 0600)", file=sys.stderr)
        else:
            print(token.encode())
        return 0
    text = sys.stdin.read() if args.token == "-" else args.token
    try:
        token = JoinToken.decode(text)
    except ValueError as exc:
        raise ConfigError(f"invalid join token: {exc}") from None
    print(json.dumps(token.grant.describe(), indent=2))
    return 0
