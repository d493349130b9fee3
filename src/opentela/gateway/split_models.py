"""Split models as the ingress sees them: which are served whole by a chain of block servers, their client-side
weights, and the chain a session takes (chain_routing's WS-RR, shortest path or PETALS' heuristic).

The ingress learns each server's costs as it uses it: the round trip of a step minus the server's own compute time
is the link's per-token time, and the compute time per block is the server's speed (its record advertises a
first estimate). Sessions this ingress runs are the load it knows of; WS-RR waits them out (Eq. 20) when a
server's attention caches are full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentela.chain_routing import SpanInfo, petals_chain, shortest_chain, ws_rr_chain
from opentela.errors import ModelNotFoundError
from opentela.gateway._config import GatewayConfig
from opentela.gateway.mesh import Mesh
from opentela.model.config import ModelConfig
from opentela.model.head import ClientHead
from opentela.model.threads import set_blas_threads
from opentela.model.tokenizer import GGUFTokenizer
from opentela.registry.record import BlockSpan, NodeRecord

_EWMA = 0.2
_DEFAULT_RTT_S = 0.002


@dataclass(frozen=True)
class SplitAssets:
    """What the ingress itself runs of a split model: embedding, final norm, LM head and tokenizer."""

    config: ModelConfig
    head: ClientHead
    tokenizer: GGUFTokenizer


@dataclass
class _Load:
    blocks: int
    ends_at: float


class SplitModels:
    """The split models the mesh can serve from this ingress, and the choice of their chains."""

    def __init__(self, mesh: Mesh, config: GatewayConfig) -> None:
        self.mesh, self.config = mesh, config
        self._files = config.split_files()
        self._assets: dict[str, SplitAssets] = {}
        self._loading: dict[str, asyncio.Future[SplitAssets]] = {}
        self.rtt_s: dict[str, float] = {}
        """Per-token link time to each server (by peer id), learned from answered steps."""
        self.block_s: dict[str, float] = {}
        """Seconds per block per token at each server (by session id), learned from answered steps."""
        self._load: dict[str, dict[int, _Load]] = {}
        self._next_load = 0

    # --- what is served --------------------------------------------------------------------------------------
    def spans(self, model: str, trusted: frozenset[str] | None = None) -> list[tuple[NodeRecord, BlockSpan]]:
        """Every live server's span of `model` (from providers on `trusted`, when given)."""
        out: list[tuple[NodeRecord, BlockSpan]] = []
        for record in self.mesh.block_servers():
            if trusted is not None and record.provider_id not in trusted:
                continue
            out.extend((record, span) for span in record.blocks if span.model == model)
        return out

    def served(self) -> dict[str, list[NodeRecord]]:
        """Split models whose live spans cover all their blocks, with the servers holding them."""
        by_model: dict[str, list[tuple[NodeRecord, BlockSpan]]] = {}
        for record in self.mesh.block_servers():
            for span in record.blocks:
                by_model.setdefault(span.model, []).append((record, span))
        return {
            model: sorted({r.session_id: r for r, _ in spans}.values(), key=lambda r: r.session_id)
            for model, spans in by_model.items()
            if _covers((s for _, s in spans), spans[0][1].total)
        }

    def any_served(self) -> bool:
        """Whether any node of the mesh serves blocks at all (cheap: the hot path asks it on every request)."""
        return bool(self.mesh.block_servers())

    # --- client-side weights -----------------------------------------------------------------------------------
    def model_file(self, model: str) -> str:
        """The GGUF file the ingress reads `model`'s head and tokenizer from."""
        if model in self._files:
            return self._files[model]
        from opentela.model.locate import SMOLLM2_ID, default_model_path

        if model == SMOLLM2_ID:
            return str(default_model_path())
        raise ModelNotFoundError(
            f"model {model!r} is split across block servers, but this ingress has no weights file for its "
            f'embedding and LM head: set [gateway] split_model_files = ["{model}=/path/to/model.gguf"]',
            param="model",
        )

    async def assets(self, model: str) -> SplitAssets:
        """The head and tokenizer of `model`, loaded once (in a thread) and kept."""
        if model in self._assets:
            return self._assets[model]
        pending = self._loading.get(model)
        if pending is None:
            path = self.model_file(model)
            pending = asyncio.ensure_future(
                asyncio.to_thread(_load_assets, path, self.config.split_head_threads)
            )
            self._loading[model] = pending
        try:
            assets = await asyncio.shield(pending)
        finally:
            if pending.done():
                self._loading.pop(model, None)
        self._assets[model] = assets
        return assets

    # --- costs and load ------------------------------------------------------------------------------------------
    def observe(self, record: NodeRecord, round_trip_s: float, compute_s: float, blocks: int) -> None:
        """Fold one answered step into the link's and the server's cost estimates."""
        link = max(round_trip_s - compute_s, 0.0)
        old = self.rtt_s.get(record.peer_id)
        self.rtt_s[record.peer_id] = link if old is None else old + _EWMA * (link - old)
        if blocks > 0 and compute_s > 0:
            per_block = compute_s / blocks
            old = self.block_s.get(record.session_id)
            self.block_s[record.session_id] = per_block if old is None else old + _EWMA * (per_block - old)

    def hold(self, links: Iterable[tuple[NodeRecord, int, int]], seconds: float) -> int:
        """Count a session's caches on its servers until it is released (or `seconds` pass); returns its key."""
        self._next_load += 1
        key = self._next_load
        ends = time.monotonic() + seconds
        for record, first, end in links:
            self._load.setdefault(record.session_id, {})[key] = _Load(end - first, ends)
        return key

    def release(self, key: int) -> None:
        """A session ended: its caches are free again."""
        for loads in self._load.values():
            loads.pop(key, None)

    # --- choosing a chain ----------------------------------------------------------------------------------------
    def choose(
        self,
        model: str,
        lo: int,
        hi: int,
        exclude: frozenset[str],
        *,
        max_length: int,
        output_len: int,
        kv_bytes_per_token_block: int,
        trusted: frozenset[str] | None = None,
    ) -> list[tuple[NodeRecord, int, int]]:
        """The servers (and blocks on each) a session for blocks [lo, hi) of `model` should take now."""
        spans = [(r, s) for r, s in self.spans(model, trusted) if r.session_id not in exclude]
        if not spans:
            raise LookupError("no live block server of this model")
        total = spans[0][1].total
        now = time.monotonic()
        infos, records = [], {}
        for record, span in spans:
            records[record.session_id] = record
            slot_bytes = max(kv_bytes_per_token_block * max_length, 1)
            loads = [
                (max(load.ends_at - now, 0.0), load.blocks)
                for load in self._load.get(record.session_id, {}).values()
            ]
            infos.append(
                SpanInfo(
                    server=record.session_id,
                    start=span.start,
                    end=span.end,
                    rtt_s=self.rtt_s.get(record.peer_id, _DEFAULT_RTT_S),
                    block_time_s=self.block_s.get(record.session_id, span.block_ms / 1000 or 1e-3),
                    cache_slots=span.cache_bytes // slot_bytes if span.cache_bytes else None,
                    sessions=tuple(loads),
                )
            )
        routing = self.config.split_routing
        if routing == "petals":
            chain = petals_chain(infos, total, lo=lo, hi=hi)
        elif routing == "shortest":
            chain = shortest_chain(infos, total, lo=lo, hi=hi)
        else:
            chain = ws_rr_chain(infos, total, output_len=max(output_len, 1), lo=lo, hi=hi)
        return [(records[str(link.server)], link.first_block, link.end_block) for link in chain]

    def stats(self) -> dict[str, Any]:
        """What the ingress has learned of its block servers."""
        return {
            "served": {m: [r.peer_id for r in rs] for m, rs in self.served().items()},
            "link_ms": {p[-8:]: round(v * 1000, 3) for p, v in self.rtt_s.items()},
            "block_ms": {s[:8]: round(v * 1000, 3) for s, v in self.block_s.items()},
            "sessions": sum(len(v) for v in self._load.values()),
        }


def _covers(spans: Iterable[BlockSpan], total: int) -> bool:
    reach = 0
    for span in sorted(spans, key=lambda s: s.start):
        if span.start > reach:
            return False
        reach = max(reach, span.end)
    return reach >= total


def _load_assets(path: str, threads: int) -> SplitAssets:
    set_blas_threads(threads)
    if not Path(path).is_file():
        raise ModelNotFoundError(f"split model weights file {path} does not exist", param="model")
    config = ModelConfig.from_gguf(path)
    return SplitAssets(config, ClientHead(path), GGUFTokenizer(path))
