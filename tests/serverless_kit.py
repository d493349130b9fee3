"""A mesh for serverless tests: an ingress, workers lending engine memory, and `otela controller` with a catalog
of serverless models; and the requests the tests send through it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from opentela.cli.localmesh import OTELA, LocalMesh, NodeProcess
from opentela.fabric.identity import Identity
from sim_engine_process import SIMULATED_TEMPLATE

SIMULATED = SIMULATED_TEMPLATE


def worker_config(path: Path, memory_mib: int) -> Path:
    """A configuration file lending `memory_mib` to engines."""
    path.write_text(f"[node]\nengine_memory_mib = {memory_mib}\n")
    return path


async def chat(mesh: LocalMesh, model: str) -> tuple[int, dict[str, Any], str]:
    """A short chat request through the ingress: status, body, the provider that served it."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with mesh.http().post(f"{mesh.api}/chat/completions", json=body) as resp:
        return resp.status, json.loads(await resp.read()), resp.headers.get("X-Otela-Provider", "")


async def models_of(mesh: LocalMesh) -> dict[str, list[str]]:
    """The models each live node serves, by provider id."""
    table = await mesh.get_json("/dnt/table") or []
    return {
        r["provider_id"]: [m["id"] for m in r["models"]]
        for r in table
        if r["lifecycle"] in ("JOIN", "SERVING")
    }


@contextlib.asynccontextmanager
async def serverless_mesh(
    tmp_path: Path, models: list[dict[str, Any]], workers: dict[str, int]
) -> AsyncIterator[tuple[LocalMesh, NodeProcess]]:
    """An ingress, workers lending the given memory (MiB), and a controller with `models` as its catalog."""
    key = tmp_path / "controller.key"
    controller_id = Identity.load_or_create(key).peer_id
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": models, "planning": {"interval_s": 5}}))
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        for name, memory in workers.items():
            config = worker_config(tmp_path / f"{name}.toml", memory)
            await mesh.add_worker(name, None, "--controllers", controller_id, "--config", str(config))
        argv = [*OTELA, "controller", "--ingress", mesh.api.removesuffix("/v1"), "--catalog", str(catalog)]
        controller = NodeProcess(
            "controller",
            [*argv, "--key-file", str(key), "--listen", "127.0.0.1:0"],
            mesh.logs / "controller.log",
        )

        async def all_up() -> bool:
            table = await mesh.get_json("/dnt/table") or []
            live = [r for r in table if r["lifecycle"] in ("JOIN", "SERVING")]
            return set(workers) <= {r["provider_id"] for r in live} and any(
                "controller" in r["roles"] for r in live
            )

        await controller.start()
        mesh.nodes["controller"] = controller
        await mesh.wait_for(all_up, timeout=60, what="the workers and the controller at the ingress")
        yield mesh, controller
