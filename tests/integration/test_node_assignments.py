"""A node taking assignments over /otela/control/1 with real sockets and engine processes: an engine that
never serves leaves the node idle again with the reason in its record; one that serves makes it SERVING;
a serving node refuses further assignments."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from opentela._types import PROTO_CONTROL, Lifecycle
from opentela.errors import StreamResetError
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.messages import read_msg, write_msg
from opentela.node._config import NodeConfig
from opentela.node.agent import NodeAgent

pytestmark = pytest.mark.integration

SIMULATED = [
    sys.executable,
    "-m",
    "opentela",
    "engine",
    "simulated",
    "--port",
    "{port}",
    "--model",
    "{model}",
]
NEVER_SERVES = [sys.executable, "-c", "import sys; sys.exit(7)", "--port", "{port}"]


@pytest.fixture
async def controller_host() -> AsyncIterator[Host]:
    host = await Host.create(Identity.generate(), "127.0.0.1:0")
    try:
        yield host
    finally:
        await host.aclose()


async def send(host: Host, agent: NodeAgent, message: dict[str, Any]) -> dict[str, Any]:
    stream = await host.open_stream(agent.peer_id, PROTO_CONTROL, addrs=agent.listen_addrs, timeout=10)
    await write_msg(stream, message)
    await stream.write_eof()
    answer = await asyncio.wait_for(read_msg(stream), 30)
    await stream.aclose()
    return answer


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_assignments_fail_back_to_idle_then_serve_then_refuse(
    tmp_path: Path, controller_host: Host
) -> None:
    node = NodeConfig(
        listen="127.0.0.1:0",
        controllers=(controller_host.peer_id,),
        reachability="public",
        health_interval=0,
        ready_timeout=60,
    )
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path) as agent:
        assert agent.registry is not None
        answer = await send(controller_host, agent, {"op": "assign", "model": "m", "command": NEVER_SERVES})
        assert answer["ok"] and answer["state"] == "starting"
        await until(
            lambda: agent.registry.local.reason.startswith("assignment failed"),
            60,
            "the failure in the record",
        )
        assert agent.registry.local.lifecycle == Lifecycle.JOIN and agent.engine is None
        assert "exit status 7" in agent.registry.local.reason
        assert agent.exit_code is None  # the node itself carries on

        answer = await send(controller_host, agent, {"op": "assign", "model": "sim-a", "command": SIMULATED})
        assert answer["ok"], answer
        await until(lambda: agent.registry.local.lifecycle == Lifecycle.SERVING, 60, "SERVING")
        assert agent.registry.local.model_ids == ("sim-a",) and agent.registry.local.reason == ""

        answer = await send(controller_host, agent, {"op": "assign", "model": "sim-b", "command": SIMULATED})
        assert answer["ok"] is False and answer["code"] == "busy"
        assert agent.registry.local.model_ids == ("sim-a",)


async def test_an_ingress_takes_no_assignments(tmp_path: Path, controller_host: Host) -> None:
    node = NodeConfig(listen="127.0.0.1:0", role="ingress", accept_assignments="any", reachability="public")
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path) as agent:
        with pytest.raises(StreamResetError) as failure:
            await send(controller_host, agent, {"op": "assign", "model": "m", "command": SIMULATED})
        assert "no handler for protocol" in str(failure.value)
