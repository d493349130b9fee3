"""`otela keys ...` and `otela start --ingress --frontend` as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from frontend_helpers import admit, counters, rates
from sqlalchemy import text

from opentela.bench.traces import CSV_COLUMNS
from opentela.cli.localmesh import OTELA, NodeProcess, free_port
from opentela.frontend.db import Database
from opentela.frontend.keys import KeySettings, KeyStore
from opentela.frontend.usage import Outcome, UsageLedger

pytestmark = pytest.mark.integration


def otela(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opentela", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


async def otela_async(*args: str, env: dict[str, str] | None = None, expect: int = 0) -> str:
    """Run `otela` without blocking the loop; stdout on the expected exit code, stderr otherwise."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opentela",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == expect, err.decode()
    return out.decode() if expect == 0 else err.decode()


def test_keys_create_list_rotate_revoke_usage(tmp_path: Path) -> None:
    # The commands are the same on PostgreSQL; the store under them is tested on both in test_store.py.
    db_url = f"sqlite:///{tmp_path / 'keys.db'}"
    made = otela(
        "keys", "--db", db_url, "--json", "create", "--name", "dave", "--rpm", "10", "--models", "a,b"
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    secret, key = created["secret"], created["key"]
    assert secret.startswith(key["prefix"]) and key["allowed_models"] == ["a", "b"] and key["rpm_limit"] == 10
    listing = otela("keys", "--db", db_url, "list")
    assert listing.returncode == 0 and key["prefix"] in listing.stdout and "10 rpm" in listing.stdout
    assert secret not in listing.stdout
    rotated = otela("keys", "--db", db_url, "rotate", key["prefix"])
    assert rotated.returncode == 0 and rotated.stdout.strip().startswith("otela-")
    assert rotated.stdout.strip() != secret
    revoked = otela("keys", "--db", db_url, "revoke", key["id"])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    listing = otela("keys", "--db", db_url, "--json", "list")
    assert json.loads(listing.stdout)[0]["state"] == "revoked"
    missing = otela("keys", "--db", db_url, "revoke", "otela-nothing")
    assert missing.returncode == 2 and "no key match" in missing.stderr
    usage = otela("keys", "--db", db_url, "usage")
    assert usage.returncode == 0 and "requests" in usage.stdout
    export = otela("keys", "--db", db_url, "export")
    assert export.stdout.splitlines() == [",".join(CSV_COLUMNS)]


def test_keys_default_to_the_data_directory(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    assert otela("keys", "create", "--name", "x", env=env).returncode == 0
    assert (tmp_path / "data" / "opentela" / "frontend.db").exists()
    bad = otela("keys", "--db", "mysql://nobody@localhost/x", "list")
    assert bad.returncode == 2 and "unsupported database" in bad.stderr


async def test_ingress_with_frontend_in_one_process(tmp_path: Path) -> None:
    http, front = free_port(), free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    node = NodeProcess(
        "ingress+frontend",
        [
            *OTELA,
            "start",
            "--ingress",
            "--frontend",
            "--listen",
            "127.0.0.1:0",
            "--http",
            f"127.0.0.1:{http}",
            "--frontend-http",
            f"127.0.0.1:{front}",
            "--log-dir",
            str(tmp_path),
        ],
        tmp_path / "node.log",
        env,
    )
    await node.start()
    try:
        deadline = time.monotonic() + 60
        info = None
        async with aiohttp.ClientSession() as session:
            while info is None and time.monotonic() < deadline:
                assert node.exited() is None, node.log_tail()
                try:
                    async with session.get(f"http://127.0.0.1:{front}/api/info") as r:
                        info = await r.json() if r.status == 200 else None
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            assert info == {
                "ingress": f"http://127.0.0.1:{http}",
                "database": "sqlite",
                "instance": info["instance"],
                "login": False,
            }
            token = (tmp_path / "data" / "opentela" / "admin-token").read_text().strip()
            assert (tmp_path / "data" / "opentela" / "admin-token").stat().st_mode & 0o777 == 0o600
            async with session.post(
                f"http://127.0.0.1:{front}/admin/keys",
                json={"name": "e"},
                headers={"Authorization": f"Bearer {token}"},
            ) as r:
                assert r.status == 201
            async with session.get(f"http://127.0.0.1:{front}/api/mesh/health") as r:
                assert r.status == 401  # the mesh views need a key or the admin token
            async with session.get(
                f"http://127.0.0.1:{front}/api/mesh/health", headers={"Authorization": f"Bearer {token}"}
            ) as r:
                assert (await r.json())["status"] == "ok"
        # `otela keys` through the running frontend's admin API, with the admin token as the credential.
        remote = ("keys", "--frontend", f"http://127.0.0.1:{front}", "--json")
        made = json.loads(
            await otela_async(*remote, "--admin-token", token, "create", "--name", "remote", "--rpm", "5")
        )
        assert made["key"]["rpm_limit"] == 5 and made["secret"].startswith("otela-")
        listing = json.loads(await otela_async(*remote, "list", env={"OTELA_FRONTEND_ADMIN_TOKEN": token}))
        assert {k["name"] for k in listing} == {"e", "remote"}
        revoked = json.loads(
            await otela_async(*remote, "--admin-token", token, "revoke", made["key"]["prefix"])
        )
        assert revoked["state"] == "revoked"
        refused = await otela_async(*remote, "--admin-token", "otela-admin-wrong", "list", expect=2)
        assert "401" in refused
        assert "frontend  http://127.0.0.1:" in node.log_text()
    finally:
        await node.stop()
    assert node.exited() == 0


async def test_keys_rebuild_counters_restores_them_from_the_rows(tmp_path: Path) -> None:
    """Counters wiped or wrong (a restore from backup, a hand edit): the command makes them the rows' sums again."""
    db_url = f"sqlite:///{tmp_path / 'keys.db'}"
    db = await Database.open(db_url)
    try:
        key, _ = await KeyStore(db).create(KeySettings(name="k", budget_tokens=10**6, rpm_limit=1000))
        ledger = UsageLedger(db, "t")
        for i in range(5):
            admission = await admit(ledger, key)
            await ledger.complete(admission, Outcome("ok", 200, input_tokens=10, output_tokens=i))
        await ledger.aclose()
        async with db.engine.begin() as conn:
            await conn.execute(text("UPDATE usage_counters SET requests = 0, tokens = 7"))
            await conn.execute(text("DELETE FROM usage_rate"))
        stored, truth = await counters(db)
        assert stored != truth and sum(r for r, _ in truth.values()) == 5
        assert (await rates(db))[0] != (await rates(db))[1]
        out = await otela_async("keys", "--db", db_url, "--json", "rebuild-counters")
        assert json.loads(out) == {"budget_counters": 1}
        stored, truth = await counters(db)
        assert stored == truth
        stored_rates, true_rates = await rates(db)
        assert stored_rates == true_rates and sum(r for r, _ in stored_rates.values()) == 5
        refused = await otela_async(
            "keys", "--frontend", "http://127.0.0.1:9", "--admin-token", "t", "rebuild-counters", expect=2
        )
        assert "use --db" in refused
    finally:
        await db.aclose()
