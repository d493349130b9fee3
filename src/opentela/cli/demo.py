"""`otela demo`: an ingress and embedded-engine workers on loopback, real answers from SmolLM2."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import tempfile
from pathlib import Path

import aiohttp
from rich.console import Console

from opentela._logging import LogConfig, setup_logging
from opentela._signals import on_stop_signals
from opentela.cli._process import run_async
from opentela.cli.localmesh import LocalMesh, embedded_engine_argv, free_port
from opentela.engines.embedded import MODEL_ID
from opentela.errors import ConfigError
from opentela.fabric.addresses import parse_addr
from opentela.frontend import Frontend, FrontendConfig, load_or_create_admin_token
from opentela.frontend.db import sqlite_url
from opentela.frontend.keys import KeySettings

console = Console(stderr=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `otela demo`."""
    parser.add_argument("--once", action="store_true", help="send one chat request, print the answer, exit")
    parser.add_argument("--workers", type=int, default=2, help="number of worker nodes (default 2)")
    parser.add_argument(
        "--http", metavar="HOST:PORT", help="ingress HTTP address (default 127.0.0.1:8092, else a free port)"
    )
    parser.add_argument(
        "--frontend-http",
        metavar="HOST:PORT",
        help="API frontend and dashboard address (default 127.0.0.1:8093)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="engine threads per worker (default: cores/workers)"
    )
    parser.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument(
        "--dir", metavar="DIR", help="where the demo keeps keys and logs (default: a temp dir)"
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the mesh to come up"
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; only warnings are logged, the console shows progress."""
    setup_logging(LogConfig(level="WARNING"))
    return run_async(run_demo(args))


async def _ask(
    http: aiohttp.ClientSession, api: str, prompt: str, key: str
) -> tuple[str, dict[str, str], dict[str, int]]:
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "temperature": 0,
    }
    async with http.post(
        f"{api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        payload = await resp.json()
        if resp.status != 200:
            raise ConfigError(f"chat request failed with {resp.status}: {payload}")
        return (
            payload["choices"][0]["message"]["content"].strip(),
            dict(resp.headers),
            payload.get("usage") or {},
        )


WORKER_RESTARTS = 3
"""How often the demo restarts a worker that exited before it leaves it down."""


def can_listen(host: str, port: int) -> bool:
    """Whether a server can listen on host:port now. Bound as our servers bind (SO_REUSEADDR): the connections a
    demo that just stopped leaves in TIME_WAIT do not keep a new one from listening, only a live listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listen_addr(given: str | None, usual: int, flag: str) -> tuple[str, int]:
    """The loopback address to serve on: the one `given` with `flag` (refused, saying why, when taken), else the
    `usual` port when free, else any free port (another demo or service may hold it)."""
    if given:
        host, port, _ = parse_addr(given)
        if host != "127.0.0.1":
            raise ConfigError(f"{given} is not a 127.0.0.1 address; the demo serves on loopback only")
        if not can_listen(host, port):
            raise ConfigError(
                f"{given} is in use by a running process (another demo?); stop it or pick another port with "
                f"{flag} 127.0.0.1:PORT"
            )
        return host, port
    if can_listen("127.0.0.1", usual):
        return "127.0.0.1", usual
    port = free_port()
    console.print(
        f"127.0.0.1:{usual} is in use (another demo?); using 127.0.0.1:{port} instead ({flag} sets it)"
    )
    return "127.0.0.1", port


async def _start_frontend(mesh: LocalMesh, workdir: Path, addr: str | None) -> tuple[Frontend, str]:
    """The API frontend in this process, in front of the demo's ingress, and a first API key."""
    host, port = listen_addr(addr, 8093, "--frontend-http")
    config = FrontendConfig(ingress=mesh.api, http=f"{host}:{port}")
    frontend = await Frontend.create(
        config,
        db_url=sqlite_url(workdir / "frontend.db"),
        admin_token=load_or_create_admin_token(workdir / "admin-token"),
        instance="demo",
    )
    try:
        await frontend.start(host, port)
        _, secret = await frontend.state.keys.create(KeySettings(name="demo-user"))
    except BaseException:
        await frontend.aclose()
        raise
    return frontend, secret


def _print_usage(api: str, frontend: Frontend, key: str, workdir: Path) -> None:
    console.print(f"\n[bold green]OpenTela demo mesh is up.[/] OpenAI-compatible endpoint: [bold]{api}[/]\n")
    console.print(f"Dashboard (models, nodes, playground, keys, usage): [bold]{frontend.url}/[/]")
    console.print(f"(The ingress itself, without keys or metering: {frontend.state.ingress.base_url}/v1)")
    console.print(f"First API key (shown once): [bold]{key}[/]", soft_wrap=True)
    console.print(
        f"Admin token: in {workdir / 'admin-token'}  ·  API reference: {frontend.url}/docs\n", soft_wrap=True
    )
    console.print("curl:", style="bold")
    console.print(
        f"  curl {api}/chat/completions -H 'Content-Type: application/json' -H 'Authorization: Bearer {key}' \\\n"
        f'    -d \'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print("\nPython (openai SDK):", style="bold")
    console.print(
        "  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{api}", api_key="{key}")\n'
        f'  reply = client.chat.completions.create(model="{MODEL_ID}",\n'
        '      messages=[{"role": "user", "content": "Hello!"}])\n'
        "  print(reply.choices[0].message.content)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"\nThe mesh as a table: otela status --ingress {frontend.state.ingress.base_url}")
    console.print("Press Ctrl-C to stop the demo.\n")


async def run_demo(args: argparse.Namespace) -> int:
    """Start the mesh, wait until every worker serves, then answer once or keep serving until Ctrl-C."""
    _, http_port = listen_addr(args.http, 8092, "--http")
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="otela-demo-"))
    threads = args.threads or max(1, (os.cpu_count() or 2) // max(1, args.workers))
    stop = asyncio.Event()
    restore_signals = on_stop_signals(stop.set)
    mesh = LocalMesh(workdir, http_port=http_port)
    frontend: Frontend | None = None
    console.print(
        f"[bold]Starting an OpenTela mesh on loopback[/]: 1 ingress + {args.workers} workers; logs in {mesh.logs}",
        soft_wrap=True,
    )
    try:
        with console.status("starting the ingress..."):
            await mesh.start_ingress()
        workers = {f"worker-{i + 1}": f"demo-provider-{i + 1}" for i in range(args.workers)}
        with console.status(f"starting {args.workers} workers with the embedded engine ({MODEL_ID})..."):
            for name, provider in workers.items():
                await mesh.add_worker(name, embedded_engine_argv(threads), provider=provider)
            serving = await mesh.wait_serving(MODEL_ID, args.workers, timeout=args.timeout)
        for r in serving:
            console.print(
                f"  replica …{r['peer_id'][-8:]} (provider {r['provider_id']}) is SERVING {MODEL_ID}"
            )
        with console.status("starting the API frontend (keys, usage, dashboard)..."):
            frontend, key = await _start_frontend(mesh, workdir, args.frontend_http)
        api = frontend.url + "/v1"
        if args.once:
            answer, headers, usage = await _ask(mesh.http(), api, args.prompt, key)
            print(f"Q: {args.prompt}")
            print(f"A: {answer}")
            print(
                f"served by node {headers.get('x-otela-node', '?')} (provider {headers.get('x-otela-provider', '?')})"
            )
            print(
                f"metered for key {key[:14]}...: {usage.get('prompt_tokens', '?')} input + "
                f"{usage.get('completion_tokens', '?')} output tokens (dashboard {frontend.url}/)"
            )
            return 0
        _print_usage(api, frontend, key, workdir)
        return await _serve(mesh, workers, threads, stop)
    finally:
        restore_signals()
        console.print("stopping the demo mesh...")
        if frontend is not None:
            await frontend.aclose()
        await mesh.aclose()


async def _serve(mesh: LocalMesh, workers: dict[str, str], threads: int, stop: asyncio.Event) -> int:
    """Keep serving until Ctrl-C or SIGTERM (0): a worker that exits is named and restarted, up to
    WORKER_RESTARTS times, while the others go on serving; with no worker left, or no ingress, the demo ends (1)."""
    restarts = dict.fromkeys(workers, 0)
    while not stop.is_set():
        ingress = mesh.nodes["ingress"]
        if ingress.exited() is not None:
            console.print(
                f"[red]the ingress exited ({ingress.exited()}); nothing can serve:[/]\n{ingress.log_tail()}"
            )
            return 1
        for name in [n for n in workers if mesh.nodes[n].exited() is not None]:
            node = mesh.nodes[name]
            left = [n for n in workers if n != name and mesh.nodes[n].exited() is None]
            console.print(
                f"[red]{name} (provider {workers[name]}) exited ({node.exited()})[/]; "
                f"{len(left)} worker(s) still serving. Its log, {node.log_path}, ends with:\n{node.log_tail(10)}",
                soft_wrap=True,
            )
            await node.stop()  # its log closed, an engine it left behind killed
            if restarts[name] < WORKER_RESTARTS:
                restarts[name] += 1
                console.print(f"restarting {name} ({restarts[name]} of {WORKER_RESTARTS} restarts)")
                await mesh.add_worker(name, embedded_engine_argv(threads), provider=workers[name])
            else:
                console.print(f"[red]{name} exited {WORKER_RESTARTS + 1} times; it stays down[/]")
                del workers[name], mesh.nodes[name]
        if not workers:
            console.print("[red]no worker is left; stopping the demo[/]")
            return 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return 0
