"""`otela controller` splits a model over idle workers: real processes, CG-BPRR placement from the catalog.

An ingress, three idle CPU workers and a controller whose catalog lists SmolLM2 as a pipeline model with 200 MiB
per server: no worker can hold the 30 blocks (14 MiB each in float32), so the controller assigns ranges that
chain, the workers load them, and the model is served through the ingress like any other. The ingress's probe
round trips (GET /v1/dnt/rtt) are what the controller planned with.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from opentela.cli.plan import fetch_rtt
from opentela.model.locate import SMOLLM2_ID
from serverless_kit import serverless_mesh

pytestmark = pytest.mark.integration

WORKERS = {"w1": 4000, "w2": 4000, "w3": 4000}
PIPELINE = {"memory_mib": 200, "concurrency": 2, "input_len": 256, "output_len": 256, "block_ms": 1.0}


@pytest.mark.timeout(240)
async def test_the_controller_splits_a_catalog_model_over_idle_workers(tmp_path: Path) -> None:
    models = [{"id": SMOLLM2_ID, "pipeline": PIPELINE}]
    async with serverless_mesh(tmp_path, models, WORKERS) as (mesh, controller):

        async def split_served() -> list[list[int]] | None:
            listing = await mesh.get_json("/models") or {"data": []}
            entry = next((m for m in listing["data"] if m["id"] == SMOLLM2_ID and m.get("split")), None)
            return sorted(s["blocks"][0] for s in entry["block_servers"]) if entry else None

        spans = await mesh.wait_for(split_served, timeout=120, what="the split model at the ingress")
        # Ranges that chain from 0 to 30, each within 200 MiB with the caches of two sessions.
        assert spans[0][0] == 0 and spans[-1][1] == 30 and len(spans) >= 3
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        assert all(end - start <= 13 for start, end in spans)
        lines = [
            json.loads(x) for x in controller.log_text().splitlines() if x.startswith('{"event": "blocks"')
        ]
        assert sorted(line["blocks"] for line in lines if line["ok"]) == spans

        body = {"model": SMOLLM2_ID, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        async with mesh.http().post(f"{mesh.api}/completions", json=body) as resp:
            answer = json.loads(await resp.read())
            assert resp.status == 200, answer
            assert resp.headers["X-Otela-Chain"].count(",") == len(spans) - 1
        assert answer["usage"]["completion_tokens"] > 0 and "Paris" in answer["choices"][0]["text"]

        rtt = await mesh.get_json("/dnt/rtt")
        (measured,) = rtt.values()
        table = await mesh.get_json("/dnt/table") or []
        workers = {r["peer_id"] for r in table if r["provider_id"] in WORKERS and r["lifecycle"] == "SERVING"}
        assert workers <= set(measured) and all(0 < measured[p] < 1000 for p in workers)
        # `otela plan --rtt URL` reads the same table.
        fetched = await asyncio.to_thread(fetch_rtt, mesh.api)
        assert set(fetched) == set(rtt) and workers <= set(next(iter(fetched.values())))
