"""Prefix affinity with real node processes: every turn of a conversation reaches the same replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = pytest.mark.integration

MODEL = "sim-chat"


def sim() -> list[str]:
    return [*OTELA, "engine", "simulated", "--model", MODEL, "--ttft-ms", "5", "--itl-ms", "1"]


async def test_all_turns_of_a_conversation_land_on_one_replica(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress("--policy", "prefix_affinity")
        await mesh.add_worker("worker-a", sim(), provider="lab-a")
        await mesh.add_worker("worker-b", sim(), provider="lab-b")
        await mesh.wait_serving(MODEL, 2, timeout=90)
        http = mesh.http()
        homes: dict[int, set[str]] = {}
        for c in range(4):
            messages: list[dict[str, Any]] = [{"role": "system", "content": f"You help with task {c}."}]
            homes[c] = set()
            for t in range(5):
                messages.append({"role": "user", "content": f"Turn {t} of conversation {c}: go on."})
                body = {"model": MODEL, "messages": messages, "max_tokens": 4}
                async with http.post(f"{mesh.api}/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    answer = await resp.json()
                    homes[c].add(resp.headers["X-Otela-Session"])
                messages.append(answer["choices"][0]["message"])
        assert all(len(sessions) == 1 for sessions in homes.values()), homes
        # New conversations spread: the ingress ties each to the replica holding fewer prefixes.
        assert len({s for sessions in homes.values() for s in sessions}) == 2, homes
        stats = (await mesh.get_json("/dnt/stats"))["gateway"]["policy_stats"]["prefix_affinity"]
        assert stats["hits"] == 4 * 4 and stats["misses"] == 4
