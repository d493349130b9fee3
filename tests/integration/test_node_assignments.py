"""A node taking assignments over /otela/control/1 with real sockets and engine processes: an engine that
never serves leaves the node idle again with the reason in its record; one that serves makes it SERVING;
a serving node refuses further assignments."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from opentela._types import PROTO_CONTROL, Lifecycle
from opentela.engines._registry import engine_from_name
from opentela.engines.profile import PerformanceProfile
from opentela.errors import StreamResetError
from opentela.fabric.host import Host
from opentela.fabric.http_tunnel import MODEL_HEADER, TunnelRequest, encode_request, read_response_head
from opentela.fabric.identity import Identity
from opentela.fabric.messages import read_msg, write_msg
from opentela.node._config import NodeConfig
from opentela.node.agent import NodeAgent
from sim_engine_process import SIMULATED_TEMPLATE

pytestmark = pytest.mark.integration

SIMULATED = SIMULATED_TEMPLATE
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


def worker_config(controller: Host, engine_memory_mib: int = 0) -> NodeConfig:
    """A worker that takes assignments from `controller` (engines beside each other within the memory, if given)."""
    return NodeConfig(
        listen="127.0.0.1:0",
        controllers=(controller.peer_id,),
        reachability="public",
        health_interval=0,
        ready_timeout=60,
        engine_memory_mib=engine_memory_mib,
    )


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_assignments_fail_back_to_idle_then_serve_then_refuse(
    tmp_path: Path, controller_host: Host
) -> None:
    node = worker_config(controller_host)
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


async def ask(agent: NodeAgent, model: str) -> dict[str, Any]:
    """A chat request for `model` through the node's own tunnel handler, as an ingress would send it."""
    assert agent.registry is not None
    stream = await agent.mesh.open_http_stream(agent.registry.local, 10)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    request = TunnelRequest("POST", "/v1/chat/completions", body.encode(), "r1", {MODEL_HEADER: model})
    await stream.write(encode_request(request))
    await stream.write_eof()
    head = await asyncio.wait_for(read_response_head(stream), 30)
    data = await asyncio.wait_for(stream.read(), 30)
    assert head.status == 200, data
    return json.loads(data)


async def test_engines_share_a_node_within_its_memory_and_stop_one_by_one(
    tmp_path: Path, controller_host: Host
) -> None:
    node = worker_config(controller_host, 3000)
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path) as agent:
        assert agent.registry is not None

        def serving() -> set[str]:
            return set(agent.registry.local.model_ids)

        a = {"op": "assign", "model": "sim-a", "command": SIMULATED, "memory_mib": 2000, "profile": "p-a"}
        assert (await send(controller_host, agent, a))["ok"]
        await until(lambda: serving() == {"sim-a"}, 60, "sim-a serving")
        too_big = {"op": "assign", "model": "sim-b", "command": SIMULATED, "memory_mib": 1001}
        refused = await send(controller_host, agent, too_big)
        assert (refused["ok"], refused["code"]) == (
            False,
            "no_room",
        ) and "2000 of the node's 3000" in refused["error"]
        again = await send(controller_host, agent, a)
        assert (again["ok"], again["code"]) == (False, "busy")
        exclusive = await send(
            controller_host, agent, {"op": "assign", "model": "sim-c", "command": SIMULATED}
        )
        assert (exclusive["ok"], exclusive["code"]) == (False, "busy")
        b = {**too_big, "memory_mib": 1000}
        assert (await send(controller_host, agent, b))["ok"]
        await until(lambda: serving() == {"sim-a", "sim-b"}, 60, "both serving")
        entries = {m.id: m for m in agent.registry.local.models}
        assert (
            entries["sim-a"].settings["memory_mib"] == 2000 and entries["sim-a"].settings["profile"] == "p-a"
        )
        assert entries["sim-b"].settings["memory_mib"] == 1000

        # Each request reaches the engine of its model.
        assert (await ask(agent, "sim-a"))["model"] == "sim-a"
        assert (await ask(agent, "sim-b"))["model"] == "sim-b"

        runner_a = next(r for r in agent.engines if "sim-a" in r.model_ids)
        pid_a = runner_a.supervisor.pid
        assert pid_a is not None
        stopped = await send(controller_host, agent, {"op": "stop", "model": "sim-a"})
        assert stopped == {"ok": True, "state": "stopped", "model": "sim-a"}
        assert serving() == {"sim-b"} and agent.registry.local.lifecycle == Lifecycle.SERVING
        await until(lambda: not _alive(pid_a), 30, "sim-a's process to exit")
        assert (await ask(agent, "sim-b"))["model"] == "sim-b"
        assert agent.exit_code is None  # stopping one engine is no failure of the node
        # Its memory is back: an engine of 2000 MiB fits again.
        c = {"op": "assign", "model": "sim-c", "command": SIMULATED, "memory_mib": 2000}
        assert (await send(controller_host, agent, c))["ok"]
        await until(lambda: serving() == {"sim-b", "sim-c"}, 60, "sim-c serving")
        missing = await send(controller_host, agent, {"op": "stop", "model": "sim-a"})
        assert (missing["ok"], missing["code"]) == (False, "not_found")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_an_engine_with_a_keep_alive_is_stopped_once_idle_and_only_then(
    tmp_path: Path, controller_host: Host
) -> None:
    node = worker_config(controller_host, 1000)
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path) as agent:
        assert agent.registry is not None
        message = {
            "op": "assign",
            "model": "sim-k",
            "command": SIMULATED,
            "memory_mib": 500,
            "keep_alive_s": 1.0,
        }
        assert (await send(controller_host, agent, message))["ok"]
        await until(lambda: agent.registry.local.model_ids == ("sim-k",), 60, "sim-k serving")
        pid = next(iter(agent.engines)).supervisor.pid
        assert pid is not None
        # Requests every 0.4 s for 2.4 s: never idle for its keep-alive, so it stays.
        for _ in range(6):
            assert (await ask(agent, "sim-k"))["model"] == "sim-k"
            await asyncio.sleep(0.4)
        assert agent.registry.local.model_ids == ("sim-k",)
        # Then nothing: it goes, its process exits, its memory is free for the next one.
        await until(lambda: agent.registry.local.model_ids == (), 10, "the keep-alive stop")
        assert "keep-alive" in agent.registry.local.reason
        await until(lambda: not _alive(pid), 30, "the engine process to exit")
        assert len(agent.engines) == 0 and agent.exit_code is None
        bigger = {"op": "assign", "model": "sim-l", "command": SIMULATED, "memory_mib": 1000}
        assert (await send(controller_host, agent, bigger))["ok"]


async def test_a_shared_engine_that_dies_is_dropped_alone(tmp_path: Path, controller_host: Host) -> None:
    node = worker_config(controller_host, 2000)
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path) as agent:
        assert agent.registry is not None
        for model in ("sim-a", "sim-b"):
            message = {"op": "assign", "model": model, "command": SIMULATED, "memory_mib": 500}
            assert (await send(controller_host, agent, message))["ok"]
        await until(lambda: set(agent.registry.local.model_ids) == {"sim-a", "sim-b"}, 60, "both serving")
        pid = next(r for r in agent.engines if "sim-a" in r.model_ids).supervisor.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await until(lambda: agent.registry.local.model_ids == ("sim-b",), 30, "sim-a dropped")
        assert agent.registry.local.reason.startswith("engine of sim-a lost")
        assert agent.exit_code is None and agent.registry.local.lifecycle == Lifecycle.SERVING
        assert (await ask(agent, "sim-b"))["model"] == "sim-b"
        # Its memory is free again.
        again = {"op": "assign", "model": "sim-c", "command": SIMULATED, "memory_mib": 1500}
        assert (await send(controller_host, agent, again))["ok"]


async def test_a_node_publishes_its_engines_profile_id(tmp_path: Path) -> None:
    lengths = (64, 128)
    profile = PerformanceProfile(
        "sim-p", "test", "cpu", lengths, (0.01, 0.02), (1, 2), lengths, ((0.01,) * 2,) * 2
    )
    profile.save(tmp_path / "p.json")
    node = NodeConfig(
        listen="127.0.0.1:0",
        reachability="public",
        health_interval=0,
        engine_profile=str(tmp_path / "p.json"),
    )
    spec = engine_from_name("simulated", "sim-p", None)
    async with NodeAgent(Identity.generate(), node, log_dir=tmp_path, engine=spec) as agent:
        assert agent.registry is not None
        await until(lambda: agent.registry.local.model_ids == ("sim-p",), 60, "SERVING")
        (entry,) = agent.registry.local.models
        assert entry.settings["profile"] == profile.profile_id and "memory_mib" not in entry.settings
