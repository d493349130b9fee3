"""Fuzz the frame layer: the decoder alone, then a live host over loopback TLS.

    python benchmarks/fuzz_frames.py --seconds 30 [--seed 1]

Half the time feeds random and mutated frame streams to FrameDecoder in random chunkings: anything but
frames or ProtocolError is a bug. The other half injects the same kind of bytes, inside TLS, into
authenticated connections to a live Host and checks after every batch that the host still answers an honest
peer, never logs an error, and never leaks an exception to the event loop. Prints a JSON summary; exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from typing import Any

from opentela._types import Stream
from opentela.errors import OpenTelaError, ProtocolError
from opentela.fabric import _frames as fr
from opentela.fabric._config import FabricConfig
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity


def random_frame(rng: random.Random, stream_ids: list[int]) -> fr.Frame:
    """A valid frame, biased towards the ids in `stream_ids` so that some hit live streams."""
    sid = rng.choice(stream_ids) if stream_ids and rng.random() < 0.7 else rng.randrange(1, 2**32)
    kind = rng.random()
    data = rng.randbytes(rng.choice([0, 1, 16, 300, 5000]))
    if kind < 0.35:
        return fr.Frame(fr.DATA, rng.choice([0, fr.FIN]), sid, data)
    if kind < 0.6:
        proto = rng.choice(["/echo", "/otela/http/1", "/x" * rng.randrange(1, 100), "ü/π"])
        return fr.Frame(fr.DATA, fr.SYN | rng.choice([0, fr.FIN]), sid, data, proto)
    if kind < 0.7:
        return fr.Frame(fr.DATA, fr.RST, sid, code=rng.randrange(2**32), message="fuzz")
    if kind < 0.8:
        return fr.Frame(fr.WINDOW_UPDATE, 0, sid, value=rng.randrange(1, 2**32))
    if kind < 0.9:
        return fr.Frame(fr.PING, rng.choice([0, fr.ACK]), 0, value=rng.randrange(2**64))
    return fr.Frame(fr.GOAWAY, 0, 0, code=rng.randrange(16), message="fuzz")


def mutate(rng: random.Random, wire: bytes) -> bytes:
    """Flip, replace, insert, delete or truncate; sometimes rewrite a header field with an extreme value."""
    buf = bytearray(wire)
    for _ in range(rng.randrange(1, 5)):
        op = rng.random()
        if not buf:
            buf += rng.randbytes(rng.randrange(1, 40))
        elif op < 0.25:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op < 0.45:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op < 0.6:
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = rng.randbytes(rng.randrange(1, 20))
        elif op < 0.75:
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randrange(1, 20)]
        elif op < 0.85:
            del buf[rng.randrange(len(buf)) :]
        elif len(buf) >= fr.HEADER_SIZE:
            field = rng.choice([(1, 1), (2, 2), (4, 4), (8, 4)])  # type, flags, stream id, length
            bits = 8 * field[1]
            value = rng.choice([0, 1, 2 ** (bits - 1), 2**bits - 1, rng.randrange(2**bits)])
            buf[field[0] : field[0] + field[1]] = value.to_bytes(field[1], "big")
    return bytes(buf)


def fuzz_input(rng: random.Random, stream_ids: list[int]) -> bytes:
    """Bytes for one round: valid frames, mutated frames, or pure garbage."""
    wire = b"".join(fr.encode_frame(random_frame(rng, stream_ids)) for _ in range(rng.randrange(1, 6)))
    roll = rng.random()
    if roll < 0.15:
        return wire
    if roll < 0.9:
        return mutate(rng, wire)
    return rng.randbytes(rng.randrange(1, 300))


def fuzz_decoder(rng: random.Random, deadline: float) -> dict[str, Any]:
    """Feed the sans-IO decoder until `deadline`; raise AssertionError on any escape."""
    stats = {"inputs": 0, "frames": 0, "protocol_errors": 0, "incomplete": 0}
    while time.monotonic() < deadline:
        for _ in range(200):
            data = fuzz_input(rng, [1, 3, 5])
            decoder = fr.FrameDecoder(max_payload=rng.choice([1024, fr.MAX_FRAME_PAYLOAD]))
            stats["inputs"] += 1
            try:
                pos = 0
                while pos < len(data):
                    step = rng.randrange(1, 64)
                    for frame in decoder.feed(data[pos : pos + step]):
                        fr.encode_frame(frame)  # everything decoded is a well-formed frame
                        stats["frames"] += 1
                    pos += step
                if decoder.buffered:
                    stats["incomplete"] += 1
            except ProtocolError:
                stats["protocol_errors"] += 1
    return stats


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


async def _echo(stream: Stream) -> None:
    while chunk := await stream.read():
        await stream.write(chunk)
    await stream.write_eof()


async def fuzz_live(rng: random.Random, deadline: float) -> dict[str, Any]:
    """Inject fuzz into authenticated connections to a live host; check it keeps serving."""
    loop = asyncio.get_running_loop()
    leaked: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: leaked.append(str(ctx.get("exception") or ctx["message"])))
    stats = {"injections": 0, "connections": 0, "disconnects_seen_by_server": 0, "health_checks": 0}
    config = FabricConfig(handshake_timeout=2.0, dial_timeout=2.0)
    async with (
        await Host.create(Identity.generate(), config=config) as server,
        await Host.create(Identity.generate(), config=config) as honest,
        await Host.create(Identity.generate(), config=config) as evil,
    ):
        server.set_handler("/echo", _echo)
        server.on_peer_disconnected(
            lambda p: stats.__setitem__("disconnects_seen_by_server", stats["disconnects_seen_by_server"] + 1)
        )
        addr = server.listen_addrs[0]
        while time.monotonic() < deadline:
            if not evil.is_connected(server.peer_id):
                await evil.connect(addr)
                stats["connections"] += 1
            conn = evil.connection(server.peer_id)
            assert conn is not None
            # A live stream or two, so that fuzz can hit real stream state.
            live = [await evil.open_stream(server.peer_id, "/echo") for _ in range(rng.randrange(0, 3))]
            for stream in live:
                await stream.write(rng.randbytes(rng.randrange(1, 2000)))
            ids = [s.stream_id for s in live] + [conn._next_id, conn._next_id + 2]
            conn._next_id += 4  # the fuzz may open these two; the client must not reuse them
            try:
                conn.send(fuzz_input(rng, ids))
            except OpenTelaError:
                pass  # our own side of the connection already gave up
            stats["injections"] += 1
            await asyncio.sleep(rng.choice([0, 0, 0.001]))
            for stream in live:
                stream.reset()
            if stats["injections"] % 25 == 0:
                stream = await honest.open_stream(server.peer_id, "/echo", addrs=[addr], timeout=2)
                await stream.write(b"still there?")
                await stream.write_eof()
                async with asyncio.timeout(2):
                    reply = await stream.read()
                if reply != b"still there?":
                    raise AssertionError(f"the host answered {reply!r} to an honest peer")
                stats["health_checks"] += 1
        stats["server_connections_at_end"] = len(server._live)
    stats["leaked_exceptions"] = leaked
    return stats


def main(argv: list[str] | None = None) -> int:
    """Run both fuzzers for --seconds in total and print a JSON summary."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="total fuzzing time")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time-based, printed)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    counter = _ErrorCounter()
    fabric_log = logging.getLogger("opentela")
    fabric_log.addHandler(counter)
    fabric_log.setLevel(logging.ERROR)  # protocol errors are logged as warnings: expected here, and many
    started = time.monotonic()
    result: dict[str, Any] = {"benchmark": "fuzz_frames", "seed": seed, "seconds": args.seconds}
    ok = True
    try:
        result["decoder"] = fuzz_decoder(rng, started + args.seconds / 2)
        result["live"] = asyncio.run(fuzz_live(rng, started + args.seconds))
        ok = not result["live"]["leaked_exceptions"]
    except Exception as exc:  # the point of a fuzzer: report what escaped
        result["failure"] = f"{type(exc).__name__}: {exc}"
        ok = False
    result["error_logs"] = counter.records[:20]
    ok = ok and not counter.records
    result["ok"] = ok
    result["elapsed_s"] = round(time.monotonic() - started, 2)
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
