"""`otela keys ...`: manage API keys and read usage directly in the frontend's database."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from opentela.cli._process import run_async
from opentela.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from opentela.frontend.db import Database


def _csv(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def add_arguments(keys: argparse.ArgumentParser) -> None:
    """Flags and actions of `otela keys`."""
    keys.add_argument("--db", metavar="URL", help="database URL (default: the frontend's, see [frontend] db)")
    keys.add_argument(
        "--frontend",
        metavar="URL",
        help="manage through a running frontend's admin API instead of the database",
    )
    keys.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="admin token for --frontend (default: $OTELA_FRONTEND_ADMIN_TOKEN)",
    )
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
    sub.add_parser(
        "rebuild-counters",
        help="recompute every budget counter and rate bucket from the usage rows (database only; safe while "
        "frontends run)",
    )


class _DatabaseKeys:
    """Key actions straight on the database."""

    def __init__(self, db: Database) -> None:
        from opentela.frontend.keys import KeyStore
        from opentela.frontend.usage import UsageLedger

        self.store, self.ledger = KeyStore(db), UsageLedger(db, "cli")

    async def create(self, settings: dict[str, Any]) -> dict[str, Any]:
        from opentela.frontend.keys import KeySettings, key_info

        key, secret = await self.store.create(KeySettings(**settings))
        return {"key": key_info(key), "secret": secret}

    async def list_keys(self) -> list[dict[str, Any]]:
        from opentela.frontend.keys import key_info

        return [key_info(k) for k in await self.store.list()]

    async def revoke(self, key_id: str) -> dict[str, Any]:
        from opentela.frontend.keys import key_info

        return key_info(await self.store.revoke(key_id))

    async def rotate(self, key_id: str) -> dict[str, Any]:
        from opentela.frontend.keys import key_info

        key, secret = await self.store.rotate(key_id)
        return {"key": key_info(key), "secret": secret}

    async def usage(self, key_id: str | None) -> list[dict[str, Any]]:
        return await self.ledger.aggregates(key_id=key_id)

    def export(self, since: float | None) -> AsyncIterator[str]:
        return self.ledger.export_trace(since=since)


class _FrontendKeys:
    """Key actions through a running frontend's admin API (the admin token is the credential)."""

    def __init__(self, http: Any, url: str) -> None:
        self.http, self.url = http, url.rstrip("/")

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        import aiohttp

        try:
            async with self.http.request(method, self.url + path, **kw) as r:
                payload = await r.json(content_type=None)
                if r.status >= 400:
                    raise ConfigError(f"the frontend answered {r.status}: {payload['error']['message']}")
                return payload
        except aiohttp.ClientError as exc:
            raise ConfigError(f"cannot reach the frontend at {self.url}: {exc}") from exc

    async def create(self, settings: dict[str, Any]) -> dict[str, Any]:
        body = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
        return await self._call("POST", "/admin/keys", json=body)

    async def list_keys(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/admin/keys"))["data"]

    async def revoke(self, key_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/admin/keys/{key_id}/revoke")

    async def rotate(self, key_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/admin/keys/{key_id}/rotate")

    async def usage(self, key_id: str | None) -> list[dict[str, Any]]:
        return (await self._call("GET", "/admin/usage", params={"key_id": key_id} if key_id else {}))["data"]

    async def export(self, since: float | None) -> AsyncIterator[str]:
        params = {"since": str(since)} if since is not None else {}
        async with self.http.get(self.url + "/admin/usage/export.csv", params=params) as r:
            if r.status >= 400:
                raise ConfigError(f"the frontend answered {r.status}: {await r.text()}")
            async for chunk in r.content.iter_any():
                yield chunk.decode()


async def _resolve(keys: _DatabaseKeys | _FrontendKeys, ref: str) -> str:
    """The id of the one key whose id or visible prefix starts with `ref`."""
    listing = await keys.list_keys()
    hits = [k for k in listing if k["id"] == ref] or [
        k for k in listing if k["prefix"].startswith(ref) or k["id"].startswith(ref)
    ]
    if len(hits) != 1:
        raise ConfigError(f"{'no key' if not hits else 'several keys'} match {ref!r}; see `otela keys list`")
    return hits[0]["id"]


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


def run(args: argparse.Namespace) -> int:
    """Run one `otela keys` action against the configured database (or, with --frontend, its admin API)."""
    from opentela.cli.frontend import frontend_db_url
    from opentela.config import load_config

    config = load_config(args.config, flags={"frontend": {"db": args.db} if args.db else {}})
    return run_async(run_keys(args, frontend_db_url(config)))


async def run_keys(args: argparse.Namespace, db_url: str) -> int:
    """Run one `otela keys` action, on the database or (with --frontend) through the admin API."""
    if args.frontend:
        import os

        import aiohttp

        token = args.admin_token or os.environ.get("OTELA_FRONTEND_ADMIN_TOKEN", "")
        if not token:
            raise ConfigError("--frontend needs the admin token: --admin-token or OTELA_FRONTEND_ADMIN_TOKEN")
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as http:
            return await _act(args, _FrontendKeys(http, args.frontend))
    # Imported here: with --frontend the database (SQLAlchemy) is never touched.
    from opentela.frontend.db import Database

    db = await Database.open(db_url)
    try:
        return await _act(args, _DatabaseKeys(db))
    finally:
        await db.aclose()


async def _act(args: argparse.Namespace, keys: _DatabaseKeys | _FrontendKeys) -> int:
    if args.keys_cmd == "create":
        made = await keys.create(
            {
                "name": args.name,
                "expires_at": time.time() + args.expires_in_days * 86400 if args.expires_in_days else None,
                "budget_tokens": args.budget_tokens,
                "budget_requests": args.budget_requests,
                "budget_period": args.budget_period,
                "rpm_limit": args.rpm,
                "tpm_limit": args.tpm,
                "allowed_models": _csv(args.models),
                "trusted_providers": _csv(args.trusted_providers),
                "log_content": not args.no_log_content,
            }
        )
        if args.json:
            print(json.dumps(made))
        else:
            print(made["secret"])
            key = made["key"]
            print(
                f"key {key['id']} ({key['prefix']}...) created; the secret above is shown only once",
                file=sys.stderr,
            )
    elif args.keys_cmd == "list":
        infos = await keys.list_keys()
        print(json.dumps(infos, indent=2)) if args.json else _print_keys(infos)
    elif args.keys_cmd == "revoke":
        info = await keys.revoke(await _resolve(keys, args.key))
        print(json.dumps(info) if args.json else f"revoked {info['id']} ({info['prefix']}...)")
    elif args.keys_cmd == "rotate":
        made = await keys.rotate(await _resolve(keys, args.key))
        print(json.dumps(made) if args.json else made["secret"])
    elif args.keys_cmd == "usage":
        rows = await keys.usage(await _resolve(keys, args.key) if args.key else None)
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
        async for part in keys.export(args.since):
            sys.stdout.write(part)
    elif args.keys_cmd == "rebuild-counters":
        if not isinstance(keys, _DatabaseKeys):
            raise ConfigError("rebuild-counters works on the database: use --db instead of --frontend")
        counters = await keys.ledger.rebuild_counters()
        print(
            json.dumps({"budget_counters": counters}) if args.json else f"rebuilt {counters} budget counters"
        )
    return 0
