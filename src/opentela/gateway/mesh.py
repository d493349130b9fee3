"""What the gateway needs from the node it runs on: the contract, so routes never reach into node internals."""

from __future__ import annotations

from typing import Any, Protocol

from opentela._types import PeerId, SessionId, Stream
from opentela.errors import OpenTelaError
from opentela.registry.record import NodeRecord


class Mesh(Protocol):
    """A node's local view of the mesh and its way to reach replicas."""

    @property
    def peer_id(self) -> PeerId: ...

    @property
    def session_id(self) -> SessionId: ...

    def candidates(self, model: str) -> list[NodeRecord]:
        """SERVING replicas of `model` that are not suspected; a local read."""
        ...

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        """Every model with at least one SERVING record, suspected replicas included."""
        ...

    def known_model_ids(self) -> set[str]:
        """Models any record has ever served, DOWN nodes included (tells 503 from 404)."""
        ...

    def is_suspected(self, peer_id: PeerId) -> bool: ...

    async def open_http_stream(self, target: NodeRecord, timeout: float) -> Stream:
        """A /otela/http/1 stream to `target` (an in-process stream when `target` is this node)."""
        ...

    def block_servers(self) -> list[NodeRecord]:
        """Live SERVING records that serve blocks of split models (their `blocks` spans), not suspected."""
        ...

    async def open_block_stream(self, target: NodeRecord, timeout: float) -> Stream:
        """A /otela/blocks/1 stream to `target`'s block server."""
        ...

    def controllers(self) -> list[NodeRecord]:
        """Live fleet controllers, which start serverless models on demand."""
        ...

    async def open_demand_stream(self, peer_id: PeerId, timeout: float) -> Stream:
        """A /otela/demand/1 stream to the controller `peer_id`."""
        ...

    def report_failure(self, target: NodeRecord, error: OpenTelaError) -> None:
        """A request to `target` failed in a way that says something about its health."""
        ...

    def table(self) -> list[dict[str, Any]]: ...

    def peers(self) -> list[dict[str, Any]]: ...

    def rtt(self) -> dict[str, dict[str, float]]: ...

    def bootstraps(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...
