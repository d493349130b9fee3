"""Loud failures with real processes on loopback: a bootstrap to nobody, to itself, and an ingress alone."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess, free_port

pytestmark = pytest.mark.integration

FAST = {"OTELA_NODE_BOOTSTRAP_WARN_AFTER": "1", "OTELA_NODE_NO_PEERS_WARN_AFTER": "1"}


async def wait_log(node: NodeProcess, *needles: str, timeout: float = 30) -> str:
    """The node's log once it holds a WARNING line with every needle."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        for line in node.log_text().splitlines():
            if " WARNING " in line and all(n in line for n in needles):
                return line
        if node.exited() is not None:
            break
        await asyncio.sleep(0.2)
    raise AssertionError(f"no WARNING with {needles} in {node.name}'s log:\n{node.log_tail(40)}")


def lone_node(tmp_path: Path, name: str, *args: str) -> NodeProcess:
    argv = [*OTELA, "start", "--key-file", str(tmp_path / f"{name}.key"), "--log-dir", str(tmp_path), *args]
    return NodeProcess(name, argv, tmp_path / f"{name}.log", {**os.environ, **FAST})


async def otela_status(ingress: str, *extra: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "opentela", "status", "--ingress", ingress, *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_a_worker_whose_bootstrap_never_answers_says_so(tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    node = lone_node(tmp_path, "lonely", "--listen", "127.0.0.1:0", "--bootstrap", closed)
    await node.start()
    try:
        line = await wait_log(node, f"bootstrap address {closed} has not answered")
        assert "still retrying" in line and "firewall" in line
        line = await wait_log(node, "joined no peer")
        assert closed in line
    finally:
        await node.stop()


async def test_a_node_bootstrapping_to_its_own_address_says_so(tmp_path: Path) -> None:
    own = f"127.0.0.1:{free_port()}"
    node = lone_node(tmp_path, "narcissus", "--listen", own, "--bootstrap", own)
    await node.start()
    try:
        line = await wait_log(node, f"bootstrap address {own} is this very node")
        assert "--key-file" in line
    finally:
        await node.stop()


async def test_an_ingress_without_peers_reports_it_until_a_worker_joins(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path, env={**os.environ, **FAST}) as mesh:
        ingress = await mesh.start_ingress()

        async def notices() -> list[dict[str, Any]] | None:
            health = await mesh.get_json("/health")
            return (health or {}).get("notices") or None

        (notice,) = await mesh.wait_for(notices, timeout=30, what="the no_peers notice")
        assert notice["code"] == "no_peers" and "otela start --bootstrap 12D3KooW" in notice["message"]
        await wait_log(ingress, "no peer has joined this ingress")
        stats = await mesh.get_json("/dnt/stats")
        assert [n["code"] for n in stats["notices"]] == ["no_peers"]
        table = await otela_status(mesh.api)
        assert "Warnings" in table and "no_peers" in table
        as_json = json.loads(await otela_status(mesh.api, "--json"))
        assert [n["code"] for n in as_json["notices"]] == ["no_peers"]

        await mesh.add_worker("worker", None)

        async def cleared() -> bool:
            health = await mesh.get_json("/health")
            return health is not None and health["notices"] == []

        await mesh.wait_for(cleared, timeout=30, what="the no_peers notice to clear")
        assert "Warnings" not in await otela_status(mesh.api)
        assert "resolved: no_peers" in ingress.log_text()
