"""A node's engines: one runner per engine, a log file each, the serving URL and models of those that serve."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from opentela.engines.base import EngineSpec
from opentela.node._config import NodeConfig
from opentela.node.engine_runner import EngineRunner
from opentela.node.engine_set import EngineSet
from opentela.registry.record import ModelEntry


async def nothing(reason: str, code: int) -> None:
    return None


def engines(tmp_path: Path, spawned: list[Any]) -> EngineSet:
    def make(spec: EngineSpec, log_path: Path, assigned: bool) -> EngineRunner:
        return EngineRunner(
            spec, log_path, NodeConfig(), stop=asyncio.Event(), on_serving=lambda r, m: None, on_fatal=nothing
        )

    def spawn(coro: Any, name: str) -> None:
        coro.close()  # not run: these tests look at the bookkeeping only
        spawned.append(name)

    return EngineSet(lambda: tmp_path, make, spawn)


def spec(port: int) -> EngineSpec:
    return EngineSpec("sim", ["true"], port=port)


def test_each_engine_gets_its_own_runner_and_log(tmp_path: Path) -> None:
    spawned: list[Any] = []
    es = engines(tmp_path, spawned)
    assert es.first is None and len(es) == 0 and es.serving_url() is None
    a = es.launch(spec(9001), "abcdef0123456789", assigned=False)
    b = es.launch(spec(9002), "abcdef0123456789", assigned=True)
    assert spawned == ["engine", "engine"] and es.first is a and list(es) == [a, b]
    assert a.log_path == tmp_path / "engine-abcdef012345.log"
    assert b.log_path == tmp_path / "engine-abcdef012345-9002.log"
    with pytest.raises(ValueError, match="already runs"):
        es.launch(spec(9001), "abcdef0123456789", assigned=False)


def test_only_serving_engines_take_requests_and_show_models(tmp_path: Path) -> None:
    es = engines(tmp_path, [])
    a = es.launch(spec(9001), "s", assigned=False)
    b = es.launch(spec(9002), "s", assigned=False)
    b.ready, b.models = True, (ModelEntry(id="m2", engine="sim"),)
    assert es.serving_url() == b.spec.base_url and [m.id for m in es.serving_models()] == ["m2"]
    a.ready, a.models = True, (ModelEntry(id="m1", engine="sim"),)
    assert [m.id for m in es.serving_models()] == ["m1", "m2"]
    es.retire()
    assert es.serving_url() is None and a.retired and b.retired
    es.forget(a)
    assert es.first is b
