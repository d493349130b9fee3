"""Serverless models with real processes: an ingress, `otela controller` with a catalog of serverless models and
two CPU workers with no engine. The first request after a model is cold is held at the ingress while the
controller starts an instance on a worker with room; after the keep-alive the worker stops it and its memory is
free again; two models share one worker and serve at once."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess
from opentela.fabric.identity import Identity
from serverless_kit import SIMULATED, chat, models_of, serverless_mesh, worker_config

pytestmark = pytest.mark.integration

KEEP_ALIVE_S = 3.0
COLD_START_BOUND_S = 30.0
"""What the test allows a cold start of the simulated engine (measured here: about 1-2 s, mostly Python start-up)."""


def write_catalog(path: Path) -> Path:
    models = [
        {
            "id": name,
            "config": "SmolLM2-135M-Instruct",
            "command": SIMULATED,
            "serverless": {"keep_alive_s": KEEP_ALIVE_S, "memory_mib": 600},
        }
        for name in ("sim-a", "sim-b")
    ]
    path.write_text(yaml.safe_dump({"models": models, "planning": {"interval_s": 5}}))
    return path


@pytest.mark.timeout(300)
async def test_cold_start_on_demand_keep_alive_and_sharing(tmp_path: Path) -> None:
    key = tmp_path / "controller.key"
    controller_id = Identity.load_or_create(key).peer_id
    catalog = write_catalog(tmp_path / "catalog.yaml")
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        # Only "big" has room for two instances; "small" has room for none.
        for name, memory in (("big", 2000), ("small", 500)):
            config = worker_config(tmp_path / f"{name}.toml", memory)
            await mesh.add_worker(name, None, "--controllers", controller_id, "--config", str(config))

        async def workers_up() -> bool:
            return {"big", "small"} <= set(await models_of(mesh))

        await mesh.wait_for(workers_up, timeout=60, what="two idle workers")
        # Before any controller: an unknown model is a plain 404.
        status, body, _ = await chat(mesh, "sim-a")
        assert status == 404, body
        argv = [*OTELA, "controller", "--ingress", mesh.api.removesuffix("/v1"), "--catalog", str(catalog)]
        controller = NodeProcess(
            "controller",
            [*argv, "--key-file", str(key), "--listen", "127.0.0.1:0"],
            mesh.logs / "controller.log",
        )
        mesh.nodes["controller"] = controller
        await controller.start()

        async def controller_known() -> bool:
            table = await mesh.get_json("/dnt/table") or []
            return any("controller" in r["roles"] for r in table if r["lifecycle"] in ("JOIN", "SERVING"))

        await mesh.wait_for(controller_known, timeout=60, what="the controller's record at the ingress")

        # Cold: the request is held while the instance starts, then answered by it.
        started = time.monotonic()
        status, body, provider = await chat(mesh, "sim-a")
        cold = time.monotonic() - started
        assert status == 200, body
        print(f"cold start through the ingress: {cold:.2f} s")
        assert body["model"] == "sim-a" and provider == "big" and cold < COLD_START_BOUND_S
        # Warm: no wait.
        started = time.monotonic()
        assert (await chat(mesh, "sim-a"))[0] == 200 and time.monotonic() - started < 2.0
        # A second model joins it on the same worker; both serve at once.
        results = await asyncio.gather(chat(mesh, "sim-b"), chat(mesh, "sim-a"), chat(mesh, "sim-b"))
        assert [r[0] for r in results] == [200, 200, 200] and {r[2] for r in results} == {"big"}
        assert sorted((await models_of(mesh))["big"]) == ["sim-a", "sim-b"]
        assert "cold start done" in controller.log_text()

        # After the keep-alive both are stopped by the worker and its memory is free again.
        async def recycled() -> bool:
            return (await models_of(mesh)).get("big") == []

        await mesh.wait_for(recycled, timeout=KEEP_ALIVE_S + 20, what="the keep-alive to stop both instances")
        status, body, provider = await chat(mesh, "sim-b")
        assert status == 200 and provider == "big", body
        assert controller.exited() is None, controller.log_tail()


# The simulated engine, 4 s late to start: a cold start long enough to kill its node in the middle of.
LATE_START = (
    "import runpy, sys, time; time.sleep(4); sys.argv = sys.argv[1:]; "
    "runpy.run_module('opentela', run_name='__main__')"
)
SLOW = [
    sys.executable,
    "-c",
    LATE_START,
    "otela",
    "engine",
    "simulated",
    "--port",
    "{port}",
    "--model",
    "{model}",
]


@pytest.mark.timeout(300)
async def test_a_node_dying_during_a_cold_start_is_replaced(tmp_path: Path) -> None:
    model = {
        "id": "slow",
        "config": "SmolLM2-135M-Instruct",
        "command": SLOW,
        "serverless": {"memory_mib": 600},
    }
    async with serverless_mesh(tmp_path, [model], {"w1": 1000, "w2": 1000}) as (mesh, controller):
        request = asyncio.create_task(chat(mesh, "slow"))

        async def starting_on() -> str | None:
            table = await mesh.get_json("/dnt/table") or []
            return next(
                (r["provider_id"] for r in table if str(r["reason"]).startswith("starting slow")), None
            )

        doomed = await mesh.wait_for(starting_on, timeout=30, what="the cold start to begin")
        mesh.nodes[doomed].signal(signal.SIGKILL, group=True)
        status, body, provider = await asyncio.wait_for(request, 120)
        assert status == 200, body
        assert provider == ({"w1", "w2"} - {doomed}).pop()
        assert "cold start failed" in controller.log_text()


@pytest.mark.timeout(300)
async def test_without_its_controller_a_warm_model_serves_and_is_still_recycled(tmp_path: Path) -> None:
    model = {
        "id": "sim-a",
        "config": "SmolLM2-135M-Instruct",
        "command": SIMULATED,
        "serverless": {"memory_mib": 600, "keep_alive_s": KEEP_ALIVE_S},
    }
    async with serverless_mesh(tmp_path, [model], {"w1": 1000}) as (mesh, controller):
        assert (await chat(mesh, "sim-a"))[0] == 200
        controller.signal(signal.SIGKILL)
        await controller.wait(10)
        assert (await chat(mesh, "sim-a"))[0] == 200  # the instance needs no controller to serve

        async def recycled() -> bool:
            return (await models_of(mesh)).get("w1") == []

        await mesh.wait_for(recycled, timeout=KEEP_ALIVE_S + 20, what="the node's own keep-alive stop")
        # Cold again and no controller to start it: an answer at once, not a hold.
        started = time.monotonic()
        status, body, _ = await chat(mesh, "sim-a")
        assert status in (404, 503) and time.monotonic() - started < 15, body


def engine_children(worker: NodeProcess) -> list[str]:
    """Command lines of the engine processes a worker runs."""
    pid = worker.pid
    assert pid is not None
    return [
        " ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True) if "engine" in c.cmdline()
    ]


@pytest.mark.timeout(300)
async def test_smollm2_starts_on_demand_beside_a_simulated_model_and_goes_after_its_keep_alive(
    tmp_path: Path,
) -> None:
    models = [
        {
            "id": "SmolLM2-135M-Instruct",
            "engine": "embedded",
            "options": {"threads": 1},
            "serverless": {"keep_alive_s": 4},
        },
        {
            "id": "sim-b",
            "config": "SmolLM2-135M-Instruct",
            "command": SIMULATED,
            "serverless": {"memory_mib": 600, "keep_alive_s": 4},
        },
    ]
    async with serverless_mesh(tmp_path, models, {"cpu-1": 2000, "cpu-2": 2000}) as (mesh, _controller):
        started = time.monotonic()
        status, body, node = await chat(mesh, "SmolLM2-135M-Instruct")
        cold = time.monotonic() - started
        print(f"SmolLM2 cold start through the ingress: {cold:.2f} s")
        assert status == 200 and node in ("cpu-1", "cpu-2"), body
        assert body["choices"][0]["message"]["content"].strip() and cold < 60
        # The second model packs onto the node that has the least room left: the same one.
        both = await asyncio.gather(chat(mesh, "sim-b"), chat(mesh, "SmolLM2-135M-Instruct"))
        assert [b[0] for b in both] == [200, 200] and {b[2] for b in both} == {node}
        serving = await models_of(mesh)
        assert (
            sorted(serving[node]) == ["SmolLM2-135M-Instruct", "sim-b"]
            and serving[({"cpu-1", "cpu-2"} - {node}).pop()] == []
        )
        assert len(engine_children(mesh.nodes[node])) == 2

        async def recycled() -> bool:
            return (await models_of(mesh)).get(node) == [] and not engine_children(mesh.nodes[node])

        await mesh.wait_for(recycled, timeout=60, what="both engines stopped and their processes gone")
