"""`otela demo`: an ingress and embedded-engine workers on loopback, real answers from SmolLM2."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import tempfile
from pathlib import Path

import aiohttp
from rich.console import Console

from opentela.engines.embedded import MODEL_ID
from opentela.errors import ConfigError
from opentela.fabric.addresses import parse_addr
from opentela.localmesh import LocalMesh, embedded_engine_argv, port_is_free

console = Console(stderr=True)


async def _ask(http: aiohttp.ClientSession, api: str, prompt: str) -> tuple[str, dict[str, str]]:
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "temperature": 0,
    }
    async with http.post(f"{api}/chat/completions", json=body) as resp:
        payload = await resp.json()
        if resp.status != 200:
            raise ConfigError(f"chat request failed with {resp.status}: {payload}")
        return payload["choices"][0]["message"]["content"].strip(), dict(resp.headers)


def _print_usage(api: str) -> None:
    console.print(f"\n[bold green]OpenTela demo mesh is up.[/] OpenAI-compatible endpoint: [bold]{api}[/]\n")
    console.print("curl:", style="bold")
    console.print(
        f"  curl {api}/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print("\nPython (openai SDK):", style="bold")
    console.print(
        "  from openai import OpenAI\n"
        f'  client = OpenAI(base_url="{api}", api_key="unused")\n'
        f'  reply = client.chat.completions.create(model="{MODEL_ID}",\n'
        '      messages=[{"role": "user", "content": "Hello!"}])\n'
        "  print(reply.choices[0].message.content)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"\nThe mesh as a table: otela status --ingress {api.removesuffix('/v1')}")
    console.print("Press Ctrl-C to stop the demo.\n")


async def run_demo(args: argparse.Namespace) -> int:
    """Start the mesh, wait until every worker serves, then answer once or keep serving until Ctrl-C."""
    http_host, http_port, _ = parse_addr(args.http)
    if http_host != "127.0.0.1" or not port_is_free(http_host, http_port):
        raise ConfigError(
            f"{args.http} is not a free 127.0.0.1 address; pick another with --http 127.0.0.1:PORT"
        )
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="otela-demo-"))
    threads = args.threads or max(1, (os.cpu_count() or 2) // max(1, args.workers))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    mesh = LocalMesh(workdir, http_port=http_port)
    console.print(
        f"[bold]Starting an OpenTela mesh on loopback[/]: 1 ingress + {args.workers} workers; logs in {mesh.logs}",
        soft_wrap=True,
    )
    try:
        with console.status("starting the ingress..."):
            await mesh.start_ingress()
        with console.status(f"starting {args.workers} workers with the embedded engine ({MODEL_ID})..."):
            for i in range(args.workers):
                await mesh.add_worker(
                    f"worker-{i + 1}", embedded_engine_argv(threads), provider=f"demo-provider-{i + 1}"
                )
            serving = await mesh.wait_serving(MODEL_ID, args.workers, timeout=args.timeout)
        for r in serving:
            console.print(
                f"  replica …{r['peer_id'][-8:]} (provider {r['provider_id']}) is SERVING {MODEL_ID}"
            )
        if args.once:
            answer, headers = await _ask(mesh.http(), mesh.api, args.prompt)
            print(f"Q: {args.prompt}")
            print(f"A: {answer}")
            print(
                f"served by node {headers.get('X-Otela-Node', '?')} (provider {headers.get('X-Otela-Provider', '?')})"
            )
            return 0
        _print_usage(mesh.api)
        while not stop.is_set():
            dead = [n for n in mesh.nodes.values() if n.exited() is not None]
            if dead:
                console.print(f"[red]{dead[0].name} exited ({dead[0].exited()}):[/]\n{dead[0].log_tail()}")
                return 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        console.print("stopping the demo mesh...")
        await mesh.aclose()
