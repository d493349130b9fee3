"""A bare TCP relay for the overhead benchmark's floor: copies bytes both ways, nothing else.

Each accepted connection gets its own upstream connection; no TLS, no parsing, no buffering beyond what the loop
hands over. Two of these in a row between a client and an engine cost what two extra user-space processes on the
path cost at the least, which is what the mesh's two (ingress and serving node) are compared with.

    python benchmarks/_byte_relay.py LISTEN_PORT UPSTREAM_PORT    (prints "listening" once it accepts)
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, downstream: asyncio.Transport) -> None:
        self.downstream = downstream

    def data_received(self, data: bytes) -> None:
        self.downstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.downstream.close()


class _Downstream(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(
                lambda: _Upstream(self.transport), "127.0.0.1", self.upstream_port
            )
        except OSError:
            self.transport.close()
            return
        self.upstream = upstream
        for data in self.early:
            upstream.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(listen_port: int, upstream_port: int) -> None:
    """Relay 127.0.0.1:`listen_port` to 127.0.0.1:`upstream_port` until killed."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Downstream(upstream_port), "127.0.0.1", listen_port)
    print("listening", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
