"""The controller's split models: keep every block of each covered by live block servers, placing missing
ranges on idle nodes with CG-BPRR (Sun et al., Alg. 1).

Each round the blocks no live (or just-assigned) server holds form gaps; each gap is planned as a model of its
own blocks over the idle nodes: memory from the node's devices (or the catalog's `memory_mib`), per-block times
from the roofline of the node's device (or the catalog's `block_ms`), client round trips from the ingress's
probes (GET /v1/dnt/rtt). The servers of the chain CG-BPRR routes the ingress through are sent
``{"op": "blocks", ...}`` with the blocks they run on it; servers already running keep their ranges (as for whole
models, the controller never takes a node back).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentela._types import Lifecycle
from opentela.errors import OpenTelaError
from opentela.scheduler import bprr
from opentela.scheduler.bprr.catalog import block_times
from opentela.scheduler.fleet import IdleNode, idle_nodes
from opentela.scheduler.hardware import Device, HardwareCatalog, builtin_catalog
from opentela.scheduler.models import ModelSpec as ShapeSpec
from opentela.scheduler.roofline import Precision

logger = logging.getLogger(__name__)

Send = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]

DEFAULT_RTT_MS = 1.0
"""Client round trip assumed for a node the ingress has not probed yet."""
FP32 = Precision("fp32", "fp32", "fp32")
"""What block servers run: GGUF weights dequantized to float32, float32 caches and hidden states."""


@dataclass(frozen=True)
class PipelineModel:
    """A split model the controller keeps covered: its blocks as the planner sees them, and how to size servers."""

    id: str
    """The model id block servers announce."""
    blocks: bprr.ModelSpec
    """L, s_m, s_c per token, the request lengths sized for, and the hidden state's bytes."""
    shape: ShapeSpec
    """The architecture, for roofline per-block times."""
    concurrency: int = 4
    """|R|: sessions every placed server must hold caches for at once (CG-BP's conservative m_j)."""
    memory_mib: int | None = None
    """Memory each server lends to the model's blocks and caches; None: its devices' memory (90 %)."""
    block_ms: float | None = None
    """Per-block decode time on every server; None: the roofline of the server's device."""


@dataclass(frozen=True)
class BlockAssignment:
    """Blocks [start, end) of `model` for the node `peer_id`."""

    peer_id: str
    model: str
    start: int
    end: int

    def message(self) -> dict[str, Any]:
        """The control message that makes the node a block server."""
        return {"op": "blocks", "model": self.model, "start": self.start, "end": self.end}


def shape_of(config: Any) -> ShapeSpec:
    """The roofline's view of a GGUF model's `opentela.model.ModelConfig`."""
    return ShapeSpec(
        name=config.name,
        hidden_size=config.hidden_size,
        num_layers=config.n_blocks,
        num_heads=config.n_heads,
        num_kv_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        max_positions=config.context_length,
        tie_word_embeddings=config.tied_embeddings,
    )


def covered_gaps(spans: Iterable[tuple[int, int]], n_blocks: int) -> list[tuple[int, int]]:
    """The maximal runs of blocks in [0, n_blocks) that no span holds."""
    held = [False] * n_blocks
    for start, end in spans:
        for b in range(max(start, 0), min(end, n_blocks)):
            held[b] = True
    gaps: list[tuple[int, int]] = []
    b = 0
    while b < n_blocks:
        if held[b]:
            b += 1
            continue
        first = b
        while b < n_blocks and not held[b]:
            b += 1
        gaps.append((first, b))
    return gaps


def _device(node: IdleNode, catalog: HardwareCatalog) -> Device | None:
    return node.entry if node.entry is not None else catalog.get(node.device)


def server_spec(model: PipelineModel, node: IdleNode, catalog: HardwareCatalog) -> bprr.ServerSpec | None:
    """The planner's view of an idle node for `model`; None when neither catalog nor settings size it."""
    device = _device(node, catalog)
    if model.memory_mib is not None:
        memory = model.memory_mib << 20
    elif device is not None:
        memory = int(device.memory_bytes * node.devices * 0.9)
    else:
        return None
    if model.block_ms is not None:
        decode = model.block_ms / 1000
        prefill = decode * model.blocks.input_len
    elif device is not None:
        decode, prefill = block_times(
            model.shape, device, FP32, model.blocks.input_len, model.blocks.output_len
        )
    else:
        return None
    return bprr.ServerSpec(node.peer_id, memory, decode, prefill, gpu=node.device)


def plan_gap(
    model: PipelineModel,
    gap: tuple[int, int],
    nodes: Sequence[IdleNode],
    rtt_ms: Mapping[str, float],
    catalog: HardwareCatalog,
) -> list[BlockAssignment]:
    """CG-BP over `nodes` for the blocks of `gap`; empty when they cannot hold all of them."""
    first, end = gap
    specs = [(n, s) for n in nodes if (s := server_spec(model, n, catalog)) is not None]
    if not specs:
        return []
    blocks = replace(model.blocks, n_blocks=end - first)
    # Client round trips from the ingress's probes, plus a hidden state each way per token (a whole input per
    # prompt) at 1 Gbit/s, as the paper's Eq. (1) counts them.
    network = bprr.Network.from_latency(
        [[rtt_ms.get(n.peer_id, DEFAULT_RTT_MS) / 1000 for n, _ in specs]],
        n_clients=1,
        n_servers=len(specs),
        token_bytes=blocks.token_bytes,
        input_len=blocks.input_len,
    )
    instance = bprr.Instance(blocks, tuple(s for _, s in specs), ("ingress",), network, (model.concurrency,))
    plan = bprr.cg_bprr(instance)
    if not plan.feasible or plan.routing is None or not plan.routing.routes:
        return []
    # CG-BP gives every server that fits some blocks; the mesh keeps the rest of its idle nodes for other
    # models, so only the servers of the chain CG-BPRR routes the ingress through are assigned, each the
    # blocks it runs on that chain (its caches were sized for `concurrency` sessions through them).
    route = plan.routing.routes[0]
    return [
        BlockAssignment(specs[h.server][0].peer_id, model.id, first + h.first_block, first + h.end_block)
        for h in route.hops
    ]


class PipelineController:
    """Keeps each split model covered by block servers, assigning ranges to idle nodes."""

    def __init__(
        self,
        models: Sequence[PipelineModel],
        records: Callable[[], Iterable[Any]],
        send: Send,
        catalog: HardwareCatalog | None = None,
        assign_timeout_s: float = 600.0,
        refused_backoff_s: float = 300.0,
    ) -> None:
        self.models = list(models)
        self._records, self._send = records, send
        self._catalog = catalog or builtin_catalog()
        self.assign_timeout_s, self.refused_backoff_s = assign_timeout_s, refused_backoff_s
        # peer id -> (when it was told, the assignment)
        self.in_flight: dict[str, tuple[float, BlockAssignment]] = {}
        self._refused: dict[str, float] = {}
        self.assigned: list[BlockAssignment] = []

    def __repr__(self) -> str:
        return f"<PipelineController models={len(self.models)} in_flight={len(self.in_flight)}>"

    def live_spans(self, model: str, records: Sequence[Any]) -> list[tuple[int, int]]:
        """Block ranges of `model` that live servers hold or were just told to load."""
        spans = [
            (span.start, span.end)
            for r in records
            if Lifecycle(r.lifecycle) in (Lifecycle.JOIN, Lifecycle.SERVING)
            for span in r.blocks
            if span.model == model
        ]
        spans += [(a.start, a.end) for _, a in self.in_flight.values() if a.model == model]
        return spans

    def decide(
        self, records: Sequence[Any], rtt_ms: Mapping[str, float], now: float | None = None
    ) -> list[BlockAssignment]:
        """This round's block assignments for every model with uncovered blocks."""
        now = time.monotonic() if now is None else now
        by_peer = {r.peer_id: r for r in records}
        self.in_flight = {
            p: (t, a)
            for p, (t, a) in self.in_flight.items()
            if now - t < self.assign_timeout_s and not (p in by_peer and by_peer[p].blocks)
        }
        self._refused = {p: t for p, t in self._refused.items() if now - t < self.refused_backoff_s}
        free = [
            n
            for n in idle_nodes(records)
            if n.peer_id not in self.in_flight and n.peer_id not in self._refused
        ]
        out: list[BlockAssignment] = []
        for model in self.models:
            for gap in covered_gaps(self.live_spans(model.id, records), model.blocks.n_blocks):
                planned = plan_gap(model, gap, free, rtt_ms, self._catalog)
                if not planned:
                    logger.warning(
                        "pipeline.unplaced",
                        extra={"model": model.id, "blocks": f"[{gap[0]}, {gap[1]})", "idle_nodes": len(free)},
                    )
                    continue
                used = {a.peer_id for a in planned}
                free = [n for n in free if n.peer_id not in used]
                out.extend(planned)
        return out

    async def run_round(
        self, rtt_ms: Mapping[str, float] | None = None
    ) -> list[tuple[BlockAssignment, dict[str, Any]]]:
        """Plan with the ingress's measured round trips (peer id -> ms), then send every assignment; a node
        that refuses is left out for a while."""
        results = []
        for a in self.decide(list(self._records()), rtt_ms or {}):
            self.in_flight[a.peer_id] = (time.monotonic(), a)
            try:
                answer = await self._send(a.peer_id, a.message())
            except (OpenTelaError, OSError, TimeoutError) as exc:
                answer = {"ok": False, "error": str(exc) or type(exc).__name__}
            if answer.get("ok"):
                self.assigned.append(a)
                logger.info(
                    "pipeline.assigned",
                    extra={"peer_id": a.peer_id, "model": a.model, "blocks": f"[{a.start}, {a.end})"},
                )
            else:
                self.in_flight.pop(a.peer_id, None)
                self._refused[a.peer_id] = time.monotonic()
                logger.warning(
                    "pipeline.refused",
                    extra={"peer_id": a.peer_id, "model": a.model, "error": answer.get("error", "")},
                )
            results.append((a, answer))
        return results


def pipeline_model_from_gguf(
    model_id: str,
    path: str,
    *,
    concurrency: int = 4,
    input_len: int = 512,
    output_len: int = 512,
    memory_mib: int | None = None,
    block_ms: float | None = None,
) -> PipelineModel:
    """A split model from its GGUF file, sized as the block servers run it (float32)."""
    from opentela.model.config import ModelConfig

    config = ModelConfig.from_gguf(path)
    blocks = bprr.ModelSpec(
        name=model_id,
        n_blocks=config.n_blocks,
        block_bytes=config.block_weight_bytes(),
        cache_bytes_per_token=math.ceil(config.kv_bytes_per_token(config.n_blocks) / config.n_blocks),
        input_len=input_len,
        output_len=output_len,
        token_bytes=config.hidden_size * 4,
    )
    return PipelineModel(model_id, blocks, shape_of(config), concurrency, memory_mib, block_ms)
