"""Fail-stop: the first fatal condition writes DOWN, ships the report and sets the exit code; later ones do not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opentela.errors import PeerUnreachableError
from opentela.node._config import NodeConfig
from opentela.node.engine_set import EngineSet
from opentela.node.failstop import FailStop
from opentela.node.logsink import LogSink


def fail_stop(
    tmp_path: Path, *, stopping: bool = False, down_fails: bool = False
) -> tuple[FailStop, list[Any]]:
    events: list[Any] = []

    async def go_down(reason: str) -> None:
        events.append(("down", reason))
        if down_fails:
            raise PeerUnreachableError("no peer")

    engines = EngineSet(lambda: tmp_path, lambda *a: None, lambda coro, name: None)  # type: ignore[arg-type,return-value]
    part = FailStop(
        NodeConfig(),
        engines,
        identify=lambda: ("peer", "session", "provider"),
        go_down=go_down,
        request_stop=lambda code: events.append(("stop", code)),
        stopping=lambda: stopping,
        log_sink=LogSink(str(tmp_path / "sink.log"), timeout=5),
    )
    return part, events


async def test_the_first_condition_wins(tmp_path: Path) -> None:
    part, events = fail_stop(tmp_path)
    await part("engine exited with code 9", 3)
    await part("fatal engine log line: NCCL error", 6)
    assert events == [("down", "engine exited with code 9"), ("stop", 3)] and part.failing
    shipped = (tmp_path / "sink.log").read_text()
    assert shipped.count("===== otela fail-stop") == 1
    assert "node=peer session=session provider=provider" in shipped and "exit=3" in shipped


async def test_a_stopping_node_ignores_it_and_a_lost_down_still_exits(tmp_path: Path) -> None:
    part, events = fail_stop(tmp_path, stopping=True)
    await part("late", 5)
    assert events == [] and not part.failing
    part, events = fail_stop(tmp_path, down_fails=True)
    await asyncio.wait_for(part("unhealthy", 5), 10)
    assert events == [("down", "unhealthy"), ("stop", 5)]
    assert part.report("unhealthy", 5).peer_id == "peer"
