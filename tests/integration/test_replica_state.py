"""A replica reconfiguring, through the mesh: a node supervising a stand-in tensor-parallel engine (a real child
process whose advertised state the test flips) puts `replica_state`, `tp_degree` and `tp_ranks` in its record and
takes them back; the ingress lists them, sends new work to the serving replica, lets a stream in flight on the
reconfiguring one run on, and still sends requests to a reconfiguring replica when it is the only one."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from opentela._types import Lifecycle
from opentela.cli.localmesh import LocalMesh
from opentela.engines._registry import engine_from_command
from opentela.engines.base import free_port
from opentela.fabric.identity import Identity
from opentela.gateway.trust import TRUST_HEADER
from opentela.node._config import NodeConfig
from opentela.node.agent import NodeAgent
from opentela.registry.record import ModelEntry
from reconfiguring_engine import MODEL, RECONFIGURING, SERVING, flip, standin_argv

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

FAST_READS = "[node]\nstate_interval = 0.2\nhealth_interval = 0.2\nhealth_failures = 1\n"
"""Reads every 0.2 s, and a single failed health check would fail-stop the node: a reconfiguring answer must not."""


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return result


def entry(agent: NodeAgent) -> ModelEntry:
    assert agent.registry is not None
    return agent.registry.local.models[0]


async def test_the_node_record_follows_its_engine_reconfiguring_and_back(tmp_path: Path) -> None:
    port = free_port()
    node = NodeConfig(
        listen="127.0.0.1:0",
        reachability="public",
        ready_timeout=30,
        health_interval=0.2,
        health_failures=1,
        state_interval=0.1,
    )
    spec = engine_from_command(standin_argv(port))
    async with NodeAgent(Identity.generate(), node, engine=spec, log_dir=tmp_path) as agent:
        assert agent.registry is not None
        await until(lambda: agent.registry.local.lifecycle == Lifecycle.SERVING, 30, "SERVING")
        first = entry(agent)
        assert (first.id, first.replica_state) == (MODEL, SERVING)
        assert first.settings["tp_degree"] == 3 and first.settings["tp_ranks"] == "0,1,2"

        # Nothing changes: the engine is read every 0.1 s, but the record is not rewritten.
        version = agent.registry.local.version
        await asyncio.sleep(0.6)
        assert agent.registry.local.version == version

        await flip(port, RECONFIGURING, "0,2")
        await until(lambda: entry(agent).replica_state == RECONFIGURING, 5, "the record to say reconfiguring")
        assert entry(agent).settings["tp_degree"] == 2 and entry(agent).settings["tp_ranks"] == "0,2"
        # Several health checks answered `reconfiguring` meanwhile; with health_failures = 1 any failure would have
        # ended the node.
        await asyncio.sleep(0.6)
        assert agent.exit_code is None and agent.registry.local.lifecycle == Lifecycle.SERVING
        assert entry(agent).replica_state == RECONFIGURING

        await flip(port, SERVING)
        await until(lambda: entry(agent).replica_state == SERVING, 5, "the record to say serving again")
        assert entry(agent).settings["tp_degree"] == 2 and entry(agent).settings["tp_ranks"] == "0,2"
        assert agent.exit_code is None


# --- through an ingress ----------------------------------------------------------------------------------------
class TwoReplicas:
    """An ingress and two workers (providers lab-a and lab-b), each supervising a stand-in engine."""

    def __init__(self, mesh: LocalMesh, ports: dict[str, int]) -> None:
        self.mesh = mesh
        self.ports = ports

    async def replica(self, provider: str) -> dict[str, Any]:
        return next(r for r in await self.mesh.replicas(MODEL) if r["provider_id"] == provider)

    async def wait_state(self, provider: str, state: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            r = await self.replica(provider)
            return r if r["replica_state"] == state else None

        return await self.mesh.wait_for(probe, timeout=15, what=f"{provider} to be {state} at the ingress")

    async def chat(
        self, *, stream: bool = False, only: str | None = None, max_tokens: int = 2
    ) -> tuple[int, str, str]:
        """Status, provider and body of a chat request through the ingress (to provider `only`, if given)."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        if stream:
            body["stream"] = True
        headers = {TRUST_HEADER: only} if only else {}
        url = f"{self.mesh.api}/chat/completions"
        # Bounded: a request sent to a replica that stays reconfiguring would wait out the ingress's timeouts.
        async with asyncio.timeout(20), self.mesh.http().post(url, json=body, headers=headers) as r:
            return r.status, r.headers.get("X-Otela-Provider", ""), (await r.read()).decode()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TwoReplicas]:
    workdir = tmp_path_factory.mktemp("replica-state")
    config = workdir / "node.toml"
    config.write_text(FAST_READS)
    ports = {"lab-a": free_port(), "lab-b": free_port()}
    async with LocalMesh(workdir) as mesh:
        await mesh.start_ingress()
        for provider, port in ports.items():
            await mesh.add_worker(provider, standin_argv(port), "--config", str(config), provider=provider)
        await mesh.wait_serving(MODEL, 2, timeout=60)
        yield TwoReplicas(mesh, ports)


async def test_the_ingress_lists_the_state_and_sends_new_work_to_the_serving_replica(
    two_replicas: TwoReplicas,
) -> None:
    mesh = two_replicas
    a = await mesh.replica("lab-a")
    assert (a["replica_state"], a["tp_degree"], a["tp_ranks"]) == (SERVING, 3, [0, 1, 2])
    await flip(mesh.ports["lab-a"], RECONFIGURING, "0,2")
    try:
        a = await mesh.wait_state("lab-a", RECONFIGURING)
        assert (a["state"], a["tp_degree"], a["tp_ranks"]) == ("SERVING", 2, [0, 2])
        assert a["settings"]["replica_state"] == RECONFIGURING
        for _ in range(6):
            status, provider, body = await mesh.chat()
            assert (status, provider) == (200, "lab-b"), body
    finally:
        await flip(mesh.ports["lab-a"], SERVING, "0,1,2")
    await mesh.wait_state("lab-a", SERVING)
    served = {(await mesh.chat())[1] for _ in range(12)}
    assert served == {"lab-a", "lab-b"}


async def test_a_stream_in_flight_runs_on_through_a_reconfiguration(two_replicas: TwoReplicas) -> None:
    mesh = two_replicas
    streaming = asyncio.create_task(mesh.chat(stream=True, only="lab-a", max_tokens=20))
    await asyncio.sleep(0.3)  # a few chunks out: the stream is under way on lab-a
    await flip(mesh.ports["lab-a"], RECONFIGURING, "1,2")
    try:
        await mesh.wait_state("lab-a", RECONFIGURING)
        assert not streaming.done()  # paused on the engine, not cut by the ingress
    finally:
        await flip(mesh.ports["lab-a"], SERVING, "1,2")
    status, provider, body = await asyncio.wait_for(streaming, 30)
    assert (status, provider) == (200, "lab-a")
    events = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "error" not in body
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "".join(f"t{i} " for i in range(20))
    await mesh.wait_state("lab-a", SERVING)


async def test_a_lone_reconfiguring_replica_still_takes_requests_which_wait(
    two_replicas: TwoReplicas,
) -> None:
    mesh = two_replicas
    await flip(mesh.ports["lab-a"], RECONFIGURING, "0")
    try:
        await mesh.wait_state("lab-a", RECONFIGURING)
        # Only lab-a is trusted: it is the one replica, so the request goes there and waits for it.
        waiting = asyncio.create_task(mesh.chat(only="lab-a"))
        await asyncio.sleep(0.5)
        assert not waiting.done()
    finally:
        await flip(mesh.ports["lab-a"], SERVING, "0")
    status, provider, body = await asyncio.wait_for(waiting, 30)
    assert (status, provider) == (200, "lab-a"), body
    await mesh.wait_state("lab-a", SERVING)
