"""The tensor-parallel engine on a mesh node: a stream through the ingress survives a SIGKILLed rank with exactly
the undisturbed text, and the node's record moves to the survivors' degree and ranks without the node going DOWN."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from opentela.cli.localmesh import LocalMesh
from opentela.engines.base import free_port
from opentela.model.locate import SMOLLM2_ID

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PROMPT = "The story of the lighthouse keeper begins"
TOKENS = 24


async def stream(mesh: LocalMesh, kill_after: int | None = None, pid: int | None = None) -> str:
    """A greedy streamed completion through the ingress; SIGKILL `pid` once `kill_after` chunks have come."""
    body = {"model": SMOLLM2_ID, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "stream": True}
    pieces: list[str] = []
    async with mesh.http().post(f"{mesh.api}/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        async for raw in answer.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            assert "error" not in event, event
            if event["choices"] and event["choices"][0]["text"]:
                pieces.append(event["choices"][0]["text"])
                if kill_after is not None and pid is not None and len(pieces) == kill_after:
                    os.kill(pid, signal.SIGKILL)
    return "".join(pieces)


async def test_a_stream_through_the_ingress_survives_a_killed_rank(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\nstate_interval = 0.2\n")
    port = free_port()
    argv = [sys.executable, "-m", "opentela", "engine", "tp", "--ranks", "3", "--port", str(port)]
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("tp-node", argv, "--config", str(config), provider="lab-tp")
        await mesh.wait_serving(SMOLLM2_ID, 1, timeout=120)
        replica = (await mesh.replicas(SMOLLM2_ID))[0]
        assert (replica["replica_state"], replica["tp_degree"], replica["tp_ranks"]) == (
            "serving",
            3,
            [0, 1, 2],
        )

        undisturbed = await stream(mesh)
        async with mesh.http().get(f"http://127.0.0.1:{port}/v1/tp") as answer:
            pids: dict[str, Any] = (await answer.json())["rank_pids"]
        assert await stream(mesh, kill_after=6, pid=int(pids["1"])) == undisturbed

        async def moved() -> dict[str, Any] | None:
            r = (await mesh.replicas(SMOLLM2_ID))[0]
            return r if r["tp_degree"] == 2 else None

        replica = await mesh.wait_for(moved, timeout=15, what="the record to show the survivors")
        assert (replica["state"], replica["replica_state"], replica["tp_ranks"]) == (
            "SERVING",
            "serving",
            [0, 2],
        )
        # The replica, on two ranks now, still answers exactly.
        assert await stream(mesh) == undisturbed
