"""The controller's split models: gaps in a model's block coverage are placed on idle nodes with CG-BP.

Records are real `NodeRecord`s; the control channel is an in-memory callable recording what would be sent."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela._types import Lifecycle
from opentela.model.locate import SMOLLM2_ID, default_model_path
from opentela.registry.record import BlockSpan, NodeRecord
from opentela.scheduler.fleet_catalog import parse_fleet_catalog
from opentela.scheduler.pipeline_control import (
    PipelineController,
    PipelineModel,
    covered_gaps,
    pipeline_model_from_gguf,
)

CPU = {"cpu": {"threads": 8, "usable": 8, "flags": ["avx2"], "model": "test"}, "ram_mib": 16384}


def worker(peer: str, blocks: tuple[BlockSpan, ...] = (), gpus: int = 0, **hardware: Any) -> NodeRecord:
    hw: dict[str, Any] = dict(CPU, **hardware)
    if gpus:
        hw = {"gpus": [{"index": i, "name": "NVIDIA A100-SXM4-80GB"} for i in range(gpus)]}
    lifecycle = Lifecycle.SERVING if blocks else Lifecycle.JOIN
    return NodeRecord(f"s-{peer}", peer, "lab", lifecycle, 1, hardware=hw, roles=("worker",), blocks=blocks)


def span(start: int, end: int) -> BlockSpan:
    return BlockSpan(SMOLLM2_ID, start, end, 30, 16, 1.0)


class Mesh:
    def __init__(self, records: list[NodeRecord], refuse: frozenset[str] = frozenset()) -> None:
        self.records, self.refuse = records, refuse
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def send(self, peer: str, message: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((peer, message))
        return {"ok": False, "error": "busy"} if peer in self.refuse else {"ok": True, "state": "loading"}


@pytest.fixture(scope="module")
def smollm2() -> PipelineModel:
    # 14 MiB of float32 weights per block: 64 MiB per node holds a few blocks and the caches of 4 sessions.
    return pipeline_model_from_gguf(SMOLLM2_ID, str(default_model_path()), memory_mib=64, block_ms=1.0)


def assigned_spans(mesh: Mesh) -> list[tuple[int, int]]:
    return sorted((m["start"], m["end"]) for _, m in mesh.sent)


async def test_an_uncovered_model_is_split_over_idle_nodes_within_their_memory(
    smollm2: PipelineModel,
) -> None:
    mesh = Mesh([worker(f"n{i}") for i in range(12)])
    results = await PipelineController([smollm2], lambda: mesh.records, mesh.send).run_round({})
    assert results and all(answer["ok"] for _, answer in results)
    assert all(m["op"] == "blocks" and m["model"] == SMOLLM2_ID for _, m in mesh.sent)
    spans = assigned_spans(mesh)
    assert covered_gaps(spans, 30) == []
    budget = 64 << 20
    per_block = smollm2.blocks.block_bytes + smollm2.blocks.cache_bytes * smollm2.concurrency
    assert all((end - start) * per_block <= budget for start, end in spans)
    assert len({p for p, _ in mesh.sent}) == len(mesh.sent)  # one range per node
    assert len(spans) >= 2  # 64 MiB cannot hold 30 blocks


async def test_only_the_missing_blocks_are_placed_and_nobody_is_told_twice(smollm2: PipelineModel) -> None:
    mesh = Mesh(
        [worker("a", (span(0, 10),)), worker("c", (span(20, 30),)), *(worker(f"n{i}") for i in range(4))]
    )
    pipelines = PipelineController([smollm2], lambda: mesh.records, mesh.send)
    await pipelines.run_round({})
    spans = assigned_spans(mesh)
    assert spans and spans[0][0] == 10 and spans[-1][1] == 20
    assert covered_gaps(spans, 30) == [(0, 10), (20, 30)]
    before = len(mesh.sent)
    await pipelines.run_round({})  # the nodes are still loading
    assert len(mesh.sent) == before
    covered = Mesh([worker("a", (span(0, 30),)), worker("n0")])
    assert await PipelineController([smollm2], lambda: covered.records, covered.send).run_round({}) == []


async def test_a_refusing_node_is_left_out_and_another_takes_its_blocks(smollm2: PipelineModel) -> None:
    mesh = Mesh([worker(f"n{i}") for i in range(12)], refuse=frozenset({"n0", "n1", "n2"}))
    pipelines = PipelineController([smollm2], lambda: mesh.records, mesh.send)
    first = await pipelines.run_round({})
    refused = {a.peer_id for a, answer in first if not answer["ok"]}
    mesh.sent.clear()
    await pipelines.run_round({})
    assert refused and not {p for p, _ in mesh.sent} & refused


async def test_faster_nodes_and_nearer_nodes_get_the_blocks(smollm2: PipelineModel) -> None:
    """Roofline times: an A100 takes the whole model rather than several CPUs; a far node is avoided."""
    roofline = pipeline_model_from_gguf(SMOLLM2_ID, str(default_model_path()))
    mesh = Mesh([worker("cpu1"), worker("gpu", gpus=1), worker("cpu2")])
    await PipelineController([roofline], lambda: mesh.records, mesh.send).run_round({})
    assert mesh.sent == [("gpu", {"op": "blocks", "model": SMOLLM2_ID, "start": 0, "end": 30})]
    roomy = replace(smollm2, memory_mib=1024)  # either node holds the whole model
    near = Mesh([worker("far"), worker("near")])
    await PipelineController([roomy], lambda: near.records, near.send).run_round({"far": 200.0, "near": 0.2})
    assert near.sent == [("near", {"op": "blocks", "model": SMOLLM2_ID, "start": 0, "end": 30})]


async def test_no_room_anywhere_places_nothing(smollm2: PipelineModel) -> None:
    mesh = Mesh([worker("n0")])  # one 64 MiB node cannot hold 30 blocks
    assert await PipelineController([smollm2], lambda: mesh.records, mesh.send).run_round({}) == []
    assert mesh.sent == []


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8), st.integers(1, 40))
def test_gaps_are_exactly_the_blocks_no_span_holds(spans: list[tuple[int, int]], n: int) -> None:
    gaps = covered_gaps(spans, n)
    in_gap = {b for a, e in gaps for b in range(a, e)}
    held = {b for a, e in spans for b in range(a, e) if b < n}
    assert in_gap == set(range(n)) - held
    assert all(a < e for a, e in gaps) and all(g[1] < h[0] for g, h in itertools.pairwise(gaps))


def test_the_catalog_takes_a_pipeline_model() -> None:
    catalog = parse_fleet_catalog(
        {"models": [{"id": SMOLLM2_ID, "pipeline": {"memory_mib": 96, "concurrency": 2, "block_ms": 2}}]}
    )
    assert catalog.models == [] and len(catalog.pipelines) == 1
    model = catalog.pipelines[0]
    assert (model.id, model.memory_mib, model.concurrency, model.block_ms) == (SMOLLM2_ID, 96, 2, 2.0)
    assert model.blocks.n_blocks == 30
    with pytest.raises(Exception, match="model_file"):
        parse_fleet_catalog({"models": [{"id": "Other-70B", "pipeline": {}}]})
    with pytest.raises(Exception, match="unknown fields"):
        parse_fleet_catalog({"models": [{"id": SMOLLM2_ID, "pipeline": {"blocks": 3}}]})
    with pytest.raises(Exception, match="only 'id' and 'pipeline'"):
        parse_fleet_catalog({"models": [{"id": SMOLLM2_ID, "pipeline": {}, "engine": "vllm"}]})
