"""`otela keys ...`: manage API keys and read usage directly in the frontend's database."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from opentela.errors import ConfigError

if TYPE_CHECKING:
    from opentela.frontend.keys import KeyStore
    from opentela.frontend.schema import ApiKey


def _csv(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def add_keys_arguments(keys: argparse.ArgumentParser) -> None:
    """Sub-commands of `otela keys`."""
    keys.add_argument("--db", metavar="URL", help="database URL (default: the frontend's, see [frontend] db)")
    keys.add_argument("--config", metavar="FILE", help="TOML or YAML configuration file")
    keys.add_argument("--json", action="store_true", help="machine-readable output")
    sub = keys.add_subparsers(dest="keys_cmd", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="create a key and print its secret (shown only once)")
    create.add_argument("--name", default="", help="who or what the key is for")
    create.add_argument("--expires-in-days", type=float, metavar="D")
    create.add_argument("--budget-tokens", type=int, metavar="N", help="tokens per budget period")
    create.add_argument("--budget-requests", type=int, metavar="N", help="requests per budget period")
    create.add_argument("--budget-period", default="month", choices=["day", "week", "month", "total"])
    create.add_argument("--rpm", type=int, metavar="N", help="requests per minute")
    create.add_argument("--tpm", type=int, metavar="N", help="tokens per minute")
    create.add_argument("--models", metavar="A,B", help="models the key may use (default: all)")
    create.add_argument("--trusted-providers", metavar="A,B", help="default trust allowlist of providers")
    create.add_argument(
        "--no-log-content", action="store_true", help="keep this key's requests out of the anonymized trace"
    )
    sub.add_parser("list", help="list keys (prefixes only)")
    for name, text in (("revoke", "revoke a key at once"), ("rotate", "give a key a new secret")):
        p = sub.add_parser(name, help=text)
        p.add_argument("key", help="key id or its visible prefix")
    usage = sub.add_parser("usage", help="requests and tokens per key, model and day")
    usage.add_argument("--key", help="only this key (id or prefix)")
    export = sub.add_parser("export", help="the anonymized trace as CSV on stdout")
    export.add_argument("--since", type=float, metavar="UNIX_TIME")


async def _resolve(store: KeyStore, ref: str) -> ApiKey:
    keys = await store.list()
    hits = [k for k in keys if k.id == ref] or [
        k for k in keys if k.prefix.startswith(ref) or k.id.startswith(ref)
    ]
    if len(hits) != 1:
        raise ConfigError(f"{'no key' if not hits else 'several keys'} match {ref!r}; see `otela keys list`")
    return hits[0]


def _print_keys(keys: list[dict[str, Any]]) -> None:
    print(f"{'id':32}  {'prefix':16}  {'state':8}  {'name':20}  limits")
    for k in keys:
        limits = []
        if k["budget_tokens"] is not None:
            limits.append(f"{k['budget_tokens']} tok/{k['budget_period']}")
        if k["budget_requests"] is not None:
            limits.append(f"{k['budget_requests']} req/{k['budget_period']}")
        if k["rpm_limit"] is not None:
            limits.append(f"{k['rpm_limit']} rpm")
        if k["tpm_limit"] is not None:
            limits.append(f"{k['tpm_limit']} tpm")
        print(
            f"{k['id']:32}  {k['prefix']:16}  {k['state']:8}  {k['name'][:20]:20}  {', '.join(limits) or '-'}"
        )


async def run_keys(args: argparse.Namespace, db_url: str) -> int:
    """Run one `otela keys` action."""
    # Imported here: `otela start` builds this parser too and should not pay for SQLAlchemy and FastAPI.
    from opentela.frontend.db import Database
    from opentela.frontend.keys import KeySettings, KeyStore, key_info
    from opentela.frontend.usage import UsageLedger

    db = await Database.open(db_url)
    try:
        store = KeyStore(db)
        if args.keys_cmd == "create":
            settings = KeySettings(
                name=args.name,
                expires_at=time.time() + args.expires_in_days * 86400 if args.expires_in_days else None,
                budget_tokens=args.budget_tokens,
                budget_requests=args.budget_requests,
                budget_period=args.budget_period,
                rpm_limit=args.rpm,
                tpm_limit=args.tpm,
                allowed_models=_csv(args.models),
                trusted_providers=_csv(args.trusted_providers),
                log_content=not args.no_log_content,
            )
            key, secret = await store.create(settings)
            if args.json:
                print(json.dumps({"key": key_info(key), "secret": secret}))
            else:
                print(secret)
                print(
                    f"key {key.id} ({key.prefix}...) created; the secret above is shown only once",
                    file=sys.stderr,
                )
        elif args.keys_cmd == "list":
            infos = [key_info(k) for k in await store.list()]
            print(json.dumps(infos, indent=2)) if args.json else _print_keys(infos)
        elif args.keys_cmd == "revoke":
            key = await store.revoke((await _resolve(store, args.key)).id)
            print(json.dumps(key_info(key)) if args.json else f"revoked {key.id} ({key.prefix}...)")
        elif args.keys_cmd == "rotate":
            key, secret = await store.rotate((await _resolve(store, args.key)).id)
            print(json.dumps({"key": key_info(key), "secret": secret}) if args.json else secret)
        elif args.keys_cmd == "usage":
            key_id = (await _resolve(store, args.key)).id if args.key else None
            rows = await UsageLedger(db, "cli").aggregates(key_id=key_id)
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print(f"{'day':10}  {'key':32}  {'model':30}  {'requests':>8}  {'input':>9}  {'output':>9}")
                for r in rows:
                    print(
                        f"{r['day']:10}  {r['key_id']:32}  {r['model'][:30]:30}  {r['requests']:8d}  "
                        f"{r['input_tokens']:9d}  {r['output_tokens']:9d}"
                    )
        elif args.keys_cmd == "export":
            async for part in UsageLedger(db, "cli").export_trace(since=args.since):
                sys.stdout.write(part)
        return 0
    finally:
        await db.aclose()
