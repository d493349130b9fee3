"""The per-node apply trace the convergence benchmark reads: one line per change, on every replica."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opentela.cli.localmesh import OTELA, LocalMesh

pytestmark = pytest.mark.integration


def sessions_in(path: Path) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        t, session, state, version, local = line.split()
        assert float(t) > 0 and int(version) >= 1 and local in ("0", "1")
        seen.setdefault(session, set()).add(state)
    return seen


async def test_every_replica_traces_every_change(tmp_path: Path) -> None:
    trace_dir = tmp_path / "traces"
    async with LocalMesh(tmp_path, env={**os.environ, "OTELA_NODE_TRACE_DIR": str(trace_dir)}) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("idle", None)
        await mesh.add_worker("server", [*OTELA, "engine", "simulated", "--model", "sim"])
        await mesh.wait_serving("sim", 1, timeout=60)

        async def all_traced() -> bool:
            files = list(trace_dir.glob("*.trace"))
            if len(files) != 3:
                return False
            views = [sessions_in(f) for f in files]
            return all(len(v) == 3 and any("SERVING" in states for states in v.values()) for v in views)

        await mesh.wait_for(
            all_traced, timeout=20, what="every replica to trace all three nodes and the model"
        )
        for f in trace_dir.glob("*.trace"):
            own = [line for line in f.read_text().splitlines() if line.split()[1] == f.stem]
            assert own and all(line.endswith(" 1") for line in own), "a node's own writes are marked local"
