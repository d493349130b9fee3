"""An in-process mesh for gateway tests: records chosen by the test, each served by a real simulated engine
through the node's real serving proxy, connected by in-memory streams with the fabric's stream semantics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from multidict import CIMultiDict

from opentela._types import PROTO_DEMAND, PROTO_HTTP, Lifecycle, PeerId, SessionId, Stream
from opentela.engines.simulated import SimulatedConfig, SimulatedServer
from opentela.errors import OpenTelaError, PeerUnreachableError
from opentela.fabric.memory import memory_stream_pair
from opentela.fabric.messages import read_msg, write_msg
from opentela.gateway._config import GatewayConfig
from opentela.gateway.app import Gateway
from opentela.node.http_service import LocalEngineProxy
from opentela.registry.record import ModelEntry, NodeRecord

MODEL = "sim-model"


def record(
    name: str,
    *,
    provider: str | None = None,
    model: str = MODEL,
    engine: str = "simulated",
    settings: Mapping[str, Any] | None = None,
    gpus: Sequence[Mapping[str, Any]] = (),
    lifecycle: Lifecycle = Lifecycle.SERVING,
) -> NodeRecord:
    """A SERVING record named `name` (session `s-name`, peer `p-name`)."""
    return NodeRecord(
        session_id=SessionId(f"s-{name}"),
        peer_id=PeerId(f"p-{name}"),
        provider_id=provider or name,
        lifecycle=lifecycle,
        version=1,
        hardware={"gpus": list(gpus)},
        models=(ModelEntry(model, engine, settings or {}),),
    )


class InProcessMesh:
    """Implements the gateway's Mesh contract over records the test controls."""

    peer_id = PeerId("p-ingress")
    session_id = SessionId("s-ingress")

    def __init__(self) -> None:
        self.records: dict[str, NodeRecord] = {}
        self.proxies: dict[str, LocalEngineProxy] = {}
        self.unreachable: set[str] = set()
        self.suspected: set[str] = set()
        self.dispatched: list[str] = []
        self.failures: list[tuple[str, str]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.demand: Callable[[str], Awaitable[dict[str, Any]]] | None = None
        """A fleet controller's answer to a want (None: the mesh has no controller)."""
        self.wants: list[str] = []
        self.more: list[str] = []
        """Models a want asked one more instance of."""

    def add(self, rec: NodeRecord, engine_url: str | None) -> NodeRecord:
        """A replica whose engine answers at `engine_url` (None: a node whose engine is not serving)."""
        self.records[rec.session_id] = rec
        self.proxies[rec.session_id] = LocalEngineProxy(lambda _model: engine_url, max_body=1 << 24)
        return rec

    def candidates(self, model: str) -> list[NodeRecord]:
        return [
            r
            for r in self.records.values()
            if r.lifecycle is Lifecycle.SERVING and model in r.model_ids and r.peer_id not in self.suspected
        ]

    def model_replicas(self) -> dict[str, list[NodeRecord]]:
        out: dict[str, list[NodeRecord]] = {}
        for r in self.records.values():
            if r.lifecycle is Lifecycle.SERVING:
                for m in r.model_ids:
                    out.setdefault(m, []).append(r)
        return out

    def known_model_ids(self) -> set[str]:
        return {m for r in self.records.values() for m in r.model_ids}

    def is_suspected(self, peer_id: PeerId) -> bool:
        return peer_id in self.suspected

    async def open_http_stream(self, target: NodeRecord, timeout: float) -> Stream:
        self.dispatched.append(target.session_id)
        if target.session_id in self.unreachable:
            raise PeerUnreachableError(f"{target.peer_id} is unreachable (test)")
        ours, theirs = memory_stream_pair(PROTO_HTTP, self.peer_id, target.peer_id)
        task = asyncio.create_task(self.proxies[target.session_id].handle_stream(theirs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ours

    def report_failure(self, target: NodeRecord, error: OpenTelaError) -> None:
        self.failures.append((target.session_id, error.code))

    def block_servers(self) -> list[NodeRecord]:
        return [r for r in self.records.values() if r.blocks and r.lifecycle is Lifecycle.SERVING]

    async def open_block_stream(self, target: NodeRecord, timeout: float) -> Stream:
        raise AssertionError("these tests run no block servers")

    def controllers(self) -> list[NodeRecord]:
        if self.demand is None:
            return []
        return [record("controller", lifecycle=Lifecycle.JOIN, model="-")]

    async def open_demand_stream(self, peer_id: PeerId, timeout: float) -> Stream:
        assert self.demand is not None
        demand = self.demand
        ours, theirs = memory_stream_pair(PROTO_DEMAND, self.peer_id, peer_id)

        async def answer() -> None:
            want = await read_msg(theirs)
            self.wants.append(want["model"])
            if want.get("more"):
                self.more.append(want["model"])
            await write_msg(theirs, await demand(want["model"]))
            await theirs.write_eof()

        task = asyncio.create_task(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ours

    def table(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.records.values()]

    def peers(self) -> list[dict[str, Any]]:
        return []

    def rtt(self) -> dict[str, dict[str, float]]:
        return {}

    def bootstraps(self) -> dict[str, Any]:
        return {"configured": [], "self": []}

    def stats(self) -> dict[str, Any]:
        return {}

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for proxy in self.proxies.values():
            await proxy.aclose()


class GatewayKit:
    """A gateway listening on loopback over an InProcessMesh, with simulated engines and a client."""

    def __init__(self, config: GatewayConfig) -> None:
        self.mesh = InProcessMesh()
        self.config = config
        self.gateway = Gateway(self.mesh, config)
        self.engines: dict[str, SimulatedServer] = {}
        self.url = ""
        self.http: aiohttp.ClientSession | None = None

    async def replica(self, name: str, engine: SimulatedConfig | None = None, **record_kw: Any) -> NodeRecord:
        """Add a replica backed by a fresh simulated engine (defaults: fast, one token)."""
        cfg = engine or SimulatedConfig(model=record_kw.get("model", MODEL), ttft_ms=1, itl_ms=0)
        server = SimulatedServer(cfg)
        await server.start()
        self.engines[name] = server
        return self.mesh.add(record(name, **record_kw), server.base_url)

    def requests_seen(self, name: str) -> int:
        """Valid requests the engine of replica `name` received."""
        handlers = self.engines[name].handlers
        assert handlers is not None
        return handlers.requests

    async def post(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str] | None = None,
        path: str = "/v1/chat/completions",
    ) -> tuple[int, Mapping[str, str], bytes]:
        """POST and read the whole answer."""
        assert self.http is not None
        async with self.http.post(self.url + path, json=body, headers=dict(headers or {})) as resp:
            # Case-insensitive, as HTTP header names are: servers differ in how they spell them.
            return resp.status, CIMultiDict(resp.headers), await resp.read()


@contextlib.asynccontextmanager
async def gateway_kit(**config: Any) -> AsyncIterator[GatewayKit]:
    """A running GatewayKit; config keywords are GatewayConfig fields."""
    kit = GatewayKit(GatewayConfig(**config))
    try:
        kit.url = await kit.gateway.start("127.0.0.1", 0)
        kit.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        yield kit
    finally:
        if kit.http is not None:
            await kit.http.close()
        await kit.gateway.aclose()
        await kit.mesh.aclose()
        for server in kit.engines.values():
            await server.aclose()


def chat(max_tokens: int = 1, stream: bool = False, **extra: Any) -> dict[str, Any]:
    """A chat request body for the simulated model."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    body.update(extra)
    return body
