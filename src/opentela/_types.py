"""Contracts shared by every layer: identifiers, lifecycle states and the byte-stream protocol."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol, runtime_checkable

PeerId = str
"""A node's identity: libp2p-style base58 of its Ed25519 public key ("12D3KooW...")."""

SessionId = str
"""A fresh random id per node start; the registry key. A restarted node gets a new one."""

ProtocolName = str
"""The name carried in a stream's opening frame, e.g. "/otela/http/1"."""


class Lifecycle(enum.IntEnum):
    """A node's lifecycle; merge keeps the greater rank, so a state never goes back."""

    JOIN = 0
    SERVING = 1
    DOWN = 2
    LEFT = 3


PROTO_HTTP: ProtocolName = "/otela/http/1"
PROTO_GOSSIP: ProtocolName = "/otela/gossip/1"
PROTO_PROBE: ProtocolName = "/otela/probe/1"
PROTO_VIEW: ProtocolName = "/otela/view/1"
"""The partial-view overlay: joins, neighbour requests and shuffles (registry/overlay.py)."""
PROTO_RELAY: ProtocolName = "/otela/relay/1"
PROTO_CONTROL: ProtocolName = "/otela/control/1"
PROTO_DEMAND: ProtocolName = "/otela/demand/1"
"""An ingress asks a controller to start a serverless model it holds requests for (scheduler/serverless.py)."""
PROTO_BLOCKS: ProtocolName = "/otela/blocks/1"
"""Hidden states and session control between a split model's chain client and its block servers."""


@runtime_checkable
class Stream(Protocol):
    """One logical, flow-controlled, bidirectional byte stream multiplexed over a peer connection.

    `read` returns b"" once the remote side half-closed; `write_eof` half-closes our side; `reset`
    aborts both directions at once and makes pending and later reads and writes on either side raise
    `StreamResetError`.
    """

    @property
    def protocol(self) -> ProtocolName: ...

    @property
    def remote_peer(self) -> PeerId: ...

    @property
    def stream_id(self) -> int: ...

    async def read(self, max_bytes: int = -1) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self) -> None: ...

    def reset(self, code: int = 0, message: str = "") -> None: ...

    def on_abort(self, callback: Callable[[], object] | None) -> None: ...

    def read_all_nowait(self) -> bytes | None: ...

    def write_last_nowait(self, data: bytes) -> bool: ...

    async def aclose(self) -> None: ...
