"""Round-trip latency of the fabric: a 1 KB request/response over a new stream per request on one connection.

    python benchmarks/fabric_rtt.py                      # uvloop, server in a second process
    python benchmarks/fabric_rtt.py --loop asyncio --inproc
    python benchmarks/fabric_rtt.py --compare            # also the transport variants, for the design record

Prints one JSON object. `--compare` adds, in-process, the same multiplexer driven through asyncio's SSL
transport (a Protocol on `create_connection(ssl=...)`) and through StreamReader/StreamWriter, to justify
running TLS on memory BIOs over a plain TCP Protocol (fabric/tls.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opentela._types import Stream
from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.mux import MuxConnection
from opentela.fabric.tls import TlsMaterial

PROTOCOL = "/otela/bench/1"


async def echo(stream: Stream) -> None:
    """Answer with what was sent."""
    data = await stream.read()
    while chunk := await stream.read():
        data += chunk
    await stream.write(data)
    await stream.write_eof()


def _install(loop_name: str) -> None:
    if loop_name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _measure(
    open_stream: Callable[[], Awaitable[Stream]], size: int, n: int, warmup: int
) -> list[float]:
    payload = b"x" * size
    samples = []
    for i in range(n + warmup):
        started = time.perf_counter()
        stream = await open_stream()
        await stream.write(payload)
        await stream.write_eof()
        got = await stream.read()
        while chunk := await stream.read():
            got += chunk
        elapsed = time.perf_counter() - started
        if len(got) != size:
            raise RuntimeError(f"short answer: {len(got)} of {size} bytes")
        if i >= warmup:
            samples.append(elapsed)
    return samples


def _summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "median_ms": round(statistics.median(ms), 4),
        "p90_ms": round(ms[int(len(ms) * 0.90)], 4),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 4),
        "mean_ms": round(statistics.fmean(ms), 4),
        "requests": len(ms),
    }


# --- the real thing: two Hosts -----------------------------------------------------------------------------
def _serve_host(conn: Any, loop_name: str) -> None:
    _install(loop_name)

    async def run() -> None:
        async with await Host.create(Identity.generate()) as host:
            host.set_handler(PROTOCOL, echo)
            conn.send((host.listen_addrs[0], host.peer_id))
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until the client is done

    asyncio.run(run())


async def _host_rtt(args: argparse.Namespace, addr: str | None) -> list[float]:
    async with await Host.create(Identity.generate()) as client:
        server = None
        if addr is None:
            server = await Host.create(Identity.generate())
            server.set_handler(PROTOCOL, echo)
            addr = server.listen_addrs[0]
        try:
            peer = await client.connect(addr)
            return await _measure(
                lambda: client.open_stream(peer, PROTOCOL), args.size, args.requests, args.warmup
            )
        finally:
            if server is not None:
                await server.aclose()


def run_hosts(args: argparse.Namespace) -> dict[str, Any]:
    """Median and tail of Host-to-Host round trips, the server in-process or in a second process."""
    if args.inproc:
        _install(args.loop)
        samples = asyncio.run(_host_rtt(args, None))
    else:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_serve_host, args=(theirs, args.loop), daemon=True)
        proc.start()
        try:
            addr, _ = ours.recv()
            _install(args.loop)
            samples = asyncio.run(_host_rtt(args, addr))
        finally:
            ours.send("done")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return _summary(samples)


# --- variants for the design record -------------------------------------------------------------------------
class _PlainMux(MuxConnection):
    """The same multiplexer fed plaintext by someone else's TLS (asyncio's SSL transport or streams)."""

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self.start("bench-peer")

    def data_received(self, data: bytes) -> None:
        self._plain_received(data)

    def _write(self, out: list[Any]) -> None:
        if self._transport is not None:
            self._transport.write(b"".join(out))


async def _variant_rtt(kind: str, args: argparse.Namespace) -> list[float]:
    loop = asyncio.get_running_loop()
    tls = TlsMaterial.create(Identity.generate())
    config = FabricConfig()
    tasks: set[asyncio.Task[None]] = set()

    def dispatch(stream: Any) -> None:
        task = loop.create_task(echo(stream))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def make(initiator: bool) -> _PlainMux:
        ctx = tls.client_context if initiator else tls.server_context
        return _PlainMux(config, ctx, initiator=initiator, on_stream=None if initiator else dispatch)

    readers: list[asyncio.Task[None]] = []
    closers: list[Callable[[], Any]] = []
    if kind == "sslproto":
        server = await loop.create_server(lambda: make(False), "127.0.0.1", 0, ssl=tls.server_context)
        port = server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(
            lambda: make(True), "127.0.0.1", port, ssl=tls.client_context, server_hostname=""
        )
    else:

        async def pump(reader: asyncio.StreamReader, conn: _PlainMux) -> None:
            while data := await reader.read(262144):
                conn.data_received(data)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = make(False)
            conn.connection_made(writer)
            closers.append(writer.close)
            await pump(reader, conn)

        server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls.server_context)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls.client_context, server_hostname=""
        )
        client = make(True)
        client.connection_made(writer)
        closers.append(writer.close)
        readers.append(loop.create_task(pump(reader, client)))

    async def open_stream() -> Stream:
        return client.open_stream(PROTOCOL)

    try:
        return await _measure(open_stream, args.size, args.requests, args.warmup)
    finally:
        for close in closers:
            close()
        if kind == "sslproto":
            client._transport.close()
        for task in readers:
            task.cancel()
        server.close()
        await asyncio.sleep(0.1)


def run_variant(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One transport variant, in-process."""
    _install(args.loop)
    return _summary(asyncio.run(_variant_rtt(kind, args)))


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run, print JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000, help="measured requests")
    parser.add_argument("--warmup", type=int, default=500, help="requests before measuring")
    parser.add_argument("--size", type=int, default=1024, help="request and response size in bytes")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--inproc", action="store_true", help="server in this process (one core for both)")
    parser.add_argument("--compare", action="store_true", help="also measure the transport variants")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "fabric_rtt",
        "what": f"{args.size} B request/response, new stream per request, one TLS connection, loopback",
        "loop": args.loop,
        "server": "in-process" if args.inproc else "separate process",
        "python": platform.python_version(),
        "host_to_host": run_hosts(args),
    }
    if args.compare:
        result["variants_inprocess"] = {
            "memory_bio_protocol (shipped)": run_hosts(argparse.Namespace(**{**vars(args), "inproc": True})),
            "asyncio_ssl_transport_protocol": run_variant("sslproto", args),
            "streamreader_streamwriter": run_variant("streams", args),
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
