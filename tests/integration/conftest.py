"""Fixtures that run real `otela start` processes on loopback and reap them whatever happens."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from opentela.cli.localmesh import LocalMesh, embedded_engine_argv
from opentela.engines.embedded import MODEL_ID

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def embedded_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalMesh]:
    """Ingress + two workers, each running the real embedded SmolLM2 engine (one thread each)."""
    workdir: Path = tmp_path_factory.mktemp("embedded-mesh")
    async with LocalMesh(workdir) as mesh:
        await mesh.start_ingress("--max-body-bytes", str(64 * 1024))
        await mesh.add_worker("worker-a", embedded_engine_argv(threads=1), provider="lab-a")
        # The provider's shorthand for a CPU machine, as opposed to an explicit engine command above.
        await mesh.add_worker("worker-b", None, "--engine", "embedded", provider="lab-b")
        await mesh.wait_serving(MODEL_ID, 2, timeout=90)
        yield mesh
