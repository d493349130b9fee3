"""`otela status`: the mesh as an ingress sees it, as a table, and the warnings the ingress has up."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opentela.cli._process import run_async
from opentela.errors import PeerUnreachableError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `otela status`."""
    parser.add_argument("--ingress", default="http://127.0.0.1:8092", metavar="URL")
    parser.add_argument(
        "--json", action="store_true", help="print the raw table, peers and notices (warnings) as JSON"
    )


def hardware_text(hw: dict[str, Any]) -> str:
    """One-line hardware summary: GPUs if any, else CPU threads; then RAM."""
    gpus = [g for g in hw.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names: dict[str, int] = {}
        for g in gpus:
            label = f"{g.get('name', 'GPU')} {round((g.get('memory_mib') or 0) / 1024)}G"
            names[label] = names.get(label, 0) + 1
        head = ", ".join(f"{n}x {label}" for label, n in names.items())
    else:
        cpu = hw.get("cpu") or {}
        head = f"CPU {cpu.get('threads', '?')} threads"
    ram = hw.get("ram_mib")
    return f"{head}, {round(ram / 1024)} GiB RAM" if ram else head


def model_text(model: Any) -> str:
    """A served model with what its engine advertises: ``m (vllm, awq, bf16, tp 2, ctx 32768)``."""
    if not isinstance(model, dict):
        return "?"
    settings = model.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    parts = [str(model.get("engine") or "")]
    for key, label in (
        ("quantization", ""),
        ("dtype", ""),
        ("tensor_parallel_size", "tp "),
        ("pipeline_parallel_size", "pp "),
        ("context_length", "ctx "),
    ):
        value = settings.get(key)
        if value is not None and value != "" and not (label and value == 1):
            parts.append(f"{label}{value}")
    details = ", ".join(p for p in parts if p)
    name = str(model.get("id", ""))
    return f"{name} ({details})" if details else name


def notice_text(notice: dict[str, Any], now: float) -> str:
    """One warning as a line: its code, for how long it has been up, and what to do."""
    since = notice.get("since")
    age = f", {max(0, round(now - since))} s" if isinstance(since, int | float) else ""
    return f"{notice.get('code', '?')}{age}: {notice.get('message', '')}"


async def fetch_mesh(ingress: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The registry table, the peer list and the notices (warnings) of an ingress."""
    base = ingress.rstrip("/").removesuffix("/v1")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"{base}/v1/dnt/table") as resp:
                resp.raise_for_status()
                table = await resp.json()
            async with http.get(f"{base}/v1/dnt/peers") as resp:
                resp.raise_for_status()
                peers = await resp.json()
            async with http.get(f"{base}/v1/health") as resp:
                resp.raise_for_status()
                # An ingress of an older release has no notices to give.
                notices = (await resp.json()).get("notices") or []
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PeerUnreachableError(f"cannot read the mesh from {base}: {exc}") from exc
    return table, peers, notices


def status_table(title: str, table: list[dict[str, Any]], peers: list[dict[str, Any]]) -> Table:
    """The node table of `otela status` from the ingress's registry table and peer list."""
    suspected = {p.get("peer_id") for p in peers if p.get("suspected")}
    out = Table(title=Text(title), show_lines=False)
    for col in ("node", "session", "provider", "role", "state", "hardware", "models", "address"):
        out.add_column(col, overflow="fold", no_wrap=col in ("node", "session", "state"))
    for rec in sorted(table, key=lambda r: (r.get("lifecycle", ""), r.get("provider_id", ""))):
        state = rec.get("lifecycle", "?")
        if rec.get("peer_id") in suspected and state in ("JOIN", "SERVING"):
            state += " (suspected)"
        cells = (
            "…" + str(rec.get("peer_id", ""))[-8:],
            str(rec.get("session_id", ""))[:8],
            str(rec.get("provider_id", "")),
            ",".join(rec.get("roles", [])),
            state,
            hardware_text(rec.get("hardware") or {}),
            ", ".join(model_text(m) for m in rec.get("models", []))
            # An idle node says what it was assigned (starting, or why the assignment failed).
            or (f"- ({str(rec['reason'])[:80]})" if rec.get("reason") and state.startswith("JOIN") else "-"),
            ", ".join(rec.get("addrs", [])[:1]),
        )
        # Every cell is text a member wrote: plain Text, so "[/]" in a provider id is not console markup.
        out.add_row(*(Text(cell) for cell in cells))
    return out


async def print_status(ingress: str, *, as_json: bool = False) -> int:
    """Print the nodes of the mesh with state, hardware and models, then the ingress's warnings."""
    table, peers, notices = await fetch_mesh(ingress)
    if as_json:
        print(json.dumps({"nodes": table, "peers": peers, "notices": notices}, indent=2))
        return 0
    out = status_table(f"OpenTela mesh at {ingress}", table, peers)
    # A pipe or a log file has no width; do not squeeze the table into 80 columns there.
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(out)
    if notices:
        now = time.time()
        console.print("\n[bold yellow]Warnings[/] (from the ingress)")
        for notice in notices:
            console.print(f"  - {notice_text(notice, now)}", markup=False, highlight=False)
    return 0


def run(args: argparse.Namespace) -> int:
    """Print the mesh the ingress sees."""
    return run_async(print_status(args.ingress, as_json=args.json))
