"""Fuzz the registry's door: random and mutated node records, gossiped by members to a live ingress.

    python benchmarks/fuzz_records.py [--records 100000] [--seed 1] [--out-dir docs/benchmarks]

Starts a real ingress and one simulated worker (`otela start` processes on loopback), joins a few members to
the ingress as fabric hosts, and pushes records over /otela/gossip/1: honest-shaped records with one or more
fields (or nested parts of `hardware` and model `settings`) replaced by hostile values, oversized records, LEFT
records with payload, records stamped in the future, floods of sessions, wrong signers, and maps that are not
records at all. Most are validly signed by one of many member identities, so they reach the schema and the
limits rather than stopping at the signature; members also evict each other's sessions and leave their own,
some at the highest version the schema allows. Throughout, a poller reads /v1/models, /v1/dnt/table,
/v1/dnt/peers, /v1/dnt/stats and /v1/health (any answer that is not 200 with strict JSON, no NaN or Infinity,
is a failure) and sends chat requests for the fuzzed models with QoS constraints (X-Otela-Require), which match
against whatever settings and hardware the records carry (any 500, or an error that is not JSON, is a failure).
The ingress's RSS is sampled all along. Prints the result as JSON and writes fuzz_records.{json,md} into
--out-dir; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import psutil

from opentela._types import PROTO_GOSSIP, Lifecycle
from opentela.cli.localmesh import OTELA, LocalMesh
from opentela.fabric.host import Host
from opentela.fabric.identity import Identity
from opentela.fabric.messages import write_msg
from opentela.registry.record import ModelEntry, NodeRecord

ROOT = Path(__file__).resolve().parent.parent
BATCH_BYTES = 3 * 1024 * 1024  # under the 4 MiB gossip message limit
BATCH_RECORDS = 200


def _deep(depth: int) -> dict[str, Any]:
    """Maps nested `depth` deep: within msgpack's nesting limit, past Python's recursion limit when walked."""
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"x": out}
    return out


HOSTILE: list[Any] = [
    None,
    True,
    False,
    -1,
    0,
    1,
    0.5,
    2**53 - 1,
    2**53,
    2**63 - 1,
    2**64 - 1,
    -(2**63),
    math.nan,
    math.inf,
    -math.inf,
    1e15,
    1e308,
    "",
    "x" * 600,
    "<script>alert(1)</script>",
    "\x00\ud7ff",
    b"\x00\xff",
    [],
    [1, "a", None],
    {},
    {"a": {"b": {"c": [math.nan]}}},
    lambda: _deep(505),  # built fresh each time: deepcopy itself would exhaust the stack
    [[[[[[[[]]]]]]]],
]
REQUIRES = ["gpu=H100", "gpu!=a100", "quantization<=8", "quantization=awq", "context>=8k", "gpu_memory>=40GB",
            "gpus>=1", "ram_mib>=1", "cpu=x86", "engine=simulated", "provider!=mallory", "hostname=n1"]  # fmt: skip


def _hostile(rng: random.Random) -> Any:
    """A fresh hostile value."""
    value = rng.choice(HOSTILE)
    return value() if callable(value) else copy.deepcopy(value)


def honest(rng: random.Random, owner: Identity, session: str, version: int) -> NodeRecord:
    """A record shaped like the ones real nodes write."""
    now = time.time()
    return NodeRecord(
        session_id=session,
        peer_id=owner.peer_id,
        provider_id=rng.choice(["lab-a", "lab-b", "mallory"]),
        lifecycle=rng.choice([Lifecycle.JOIN, Lifecycle.SERVING, Lifecycle.SERVING, Lifecycle.DOWN]),
        version=version,
        addrs=("127.0.0.1:9",),
        roles=("worker",),
        hardware={
            "gpus": [
                {"index": 0, "name": rng.choice(["NVIDIA H100", "A100"]), "memory_mib": 81920, "uuid": "g"}
            ],
            "gpu_source": "nvml",
            "cpu": {
                "model": "x86",
                "arch": "x86_64",
                "cores": 8,
                "threads": 16,
                "usable": 16,
                "flags": ["avx2"],
            },
            "ram_mib": 65536,
            "os": "Linux",
            "hostname": "n1",
        },
        models=(
            ModelEntry(
                rng.choice(["fuzz-a", "fuzz-b", "sim"]),
                "simulated",
                {"context_length": 4096, "gpu": "H100", "quantization": rng.choice(["awq", "fp8", None])},
            ),
        ),
        started_at=now - 10,
        updated_at=now,
    )


def _set_path(obj: dict[str, Any], rng: random.Random, value: Any) -> str:
    """Replace one value somewhere inside `obj` (descending into maps and lists); the path it replaced."""
    path = []
    node: Any = obj
    while True:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
            path.append(str(key))
            if isinstance(node[key], dict | list) and node[key] and rng.random() < 0.6:
                node = node[key]
                continue
            node[key] = value
            return ".".join(path)
        if isinstance(node, list) and node:
            i = rng.randrange(len(node))
            path.append(str(i))
            if isinstance(node[i], dict | list) and node[i] and rng.random() < 0.6:
                node = node[i]
                continue
            node[i] = value
            return ".".join(path)
        return ".".join(path)


def mutated(rng: random.Random, owners: list[Identity], sessions: dict[str, list[str]]) -> tuple[str, Any]:
    """One fuzz case: (its kind, the wire map to send)."""
    owner = rng.choice(owners)
    pool = sessions[owner.peer_id]
    session = rng.choice(pool) if pool and rng.random() < 0.5 else uuid.uuid4().hex
    if session not in pool:
        pool.append(session)
    base = honest(rng, owner, session, rng.randrange(1, 10_000))
    kind = rng.random()
    if kind < 0.10:
        return "honest", base.signed(owner).to_wire()
    if kind < 0.55:
        wire = base.to_wire()
        for _ in range(rng.randrange(1, 4)):
            _set_path(wire, rng, _hostile(rng))
        return "mutated_signed", _signed_wire(wire, owner)
    if kind < 0.62:
        pad = "p" * rng.choice([10_000, 70_000, 200_000])
        record = base.next(owner, models=(ModelEntry("fuzz-a", "simulated", {"pad": pad}),))
        return "oversized", record.to_wire()
    if kind < 0.69:
        record = base.next(owner, lifecycle=Lifecycle.LEFT, reason="fuzz")
        return "left_with_payload", record.to_wire()
    if kind < 0.76:
        ahead = rng.choice([600.0, 86400.0, 1e9])
        record = base.next(owner, updated_at=time.time() + ahead)
        return "future", record.to_wire()
    if kind < 0.83:
        victim = rng.choice([o for o in owners if o is not owner])
        record = honest(rng, victim, uuid.uuid4().hex, 1).signed(owner)
        return "wrong_signer", record.to_wire()
    if kind < 0.88:
        wire = base.signed(owner).to_wire()
        _set_path(wire, rng, _hostile(rng))
        return "tampered", wire
    if kind < 0.94:
        # A live record (sometimes at the highest live version), then its end: the owner's departure or
        # another member's eviction, both one version above it.
        if rng.random() < 0.3:
            base = honest(rng, owner, session, 2**53 - 1)
        live = base.signed(owner)
        if rng.random() < 0.5:
            end = live.tombstone().next(owner, lifecycle=Lifecycle.LEFT, reason=rng.choice(["", "bye"]))
        else:
            evictor = rng.choice([o for o in owners if o is not owner])
            end = live.tombstone(version=live.version + 1, reason="suspected").signed(evictor)
        return "live_then_left", [live.to_wire(), end.to_wire()]
    garbage: Any = rng.choice([{}, {"session_id": 1}, [], "record", 7, {"version": math.nan}, None])
    return "garbage", garbage


def _signed_wire(wire: dict[str, Any], owner: Identity) -> dict[str, Any]:
    """Sign an arbitrary wire map the way records are signed (canonical msgpack, sorted keys)."""
    from opentela.registry.record import _DOMAIN, _canonical  # the signing form itself is what we fuzz

    body = {k: v for k, v in wire.items() if k != "signature"}
    body["signer"] = owner.peer_id
    try:
        signature = owner.sign(_DOMAIN + _canonical(body))
    except (TypeError, ValueError, OverflowError, RecursionError):
        signature = b"\0" * 64
    return {**body, "signature": signature}


def _packable(obj: Any) -> bool:
    try:
        msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


async def route(mesh: LocalMesh, rng: random.Random, result: dict[str, Any]) -> None:
    """One chat request for a fuzzed model with QoS constraints: any answer but a 500, with JSON, is fine
    (the fuzzed replicas are not reachable, so 502/503 are expected)."""
    model = rng.choice(["fuzz-a", "fuzz-b", "sim"])
    require = ",".join(rng.sample(REQUIRES, rng.randrange(1, 3)))
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        async with asyncio.timeout(30):
            async with mesh.http().post(
                mesh.api + "/chat/completions", json=body, headers={"X-Otela-Require": require}
            ) as resp:
                text = await resp.text()
                if resp.status == 500 or resp.status > 504:
                    raise ValueError(f"status {resp.status}: {text[:200]}")
                _strict_json(text)
        result["routed"] += 1
    except Exception as exc:  # a failure of routing over fuzzed records is what we are looking for
        result["failures"].append(f"POST {model} require {require}: {exc!r}"[:300])


async def poll(mesh: LocalMesh, stop: asyncio.Event, result: dict[str, Any]) -> None:
    """Read every view and route a request until `stop`; count answers and failures."""
    paths = ["/models", "/dnt/table", "/dnt/peers", "/dnt/stats", "/health"]
    http = mesh.http()
    rng = random.Random(7)
    while not stop.is_set():
        await route(mesh, rng, result)
        for path in paths:
            try:
                async with http.get(mesh.api + path) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise ValueError(f"status {resp.status}: {text[:200]}")
                    _strict_json(text)
                result["polls"] += 1
            except Exception as exc:  # any failure of a view is what we are looking for
                result["failures"].append(f"{path}: {exc!r}"[:300])
        await asyncio.sleep(0.05)


async def sample_rss(pid: int, stop: asyncio.Event, samples: list[int]) -> None:
    """RSS of the ingress every 0.5 s."""
    proc = psutil.Process(pid)
    while not stop.is_set():
        samples.append(proc.memory_info().rss)
        await asyncio.sleep(0.5)


async def fuzz(count: int, seed: int, workdir: Path) -> dict[str, Any]:
    """Run the fuzz campaign; the result as a dict."""
    rng = random.Random(seed)
    owners = [Identity.generate() for _ in range(48)]
    sessions: dict[str, list[str]] = {o.peer_id: [] for o in owners}
    result: dict[str, Any] = {"polls": 0, "routed": 0, "failures": [], "sent_by_kind": {}}
    sim = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]
    started = time.perf_counter()
    async with LocalMesh(workdir) as mesh:
        ingress = await mesh.start_ingress()
        await mesh.add_worker("worker", sim, provider="lab-a")
        await mesh.wait_serving("sim", 1, timeout=60)
        assert ingress.pid is not None
        members = [await Host.create(Identity.generate()) for _ in range(4)]
        peers = [await m.connect(mesh.bootstrap) for m in members]
        stop = asyncio.Event()
        rss: list[int] = []
        tasks = [
            asyncio.create_task(poll(mesh, stop, result)),
            asyncio.create_task(sample_rss(ingress.pid, stop, rss)),
        ]
        await asyncio.sleep(1.0)
        rss_start = rss[-1]
        sent = 0
        try:
            while sent < count:
                batch: list[Any] = []
                size = 0
                while len(batch) < BATCH_RECORDS and sent + len(batch) < count:
                    kind, wire = mutated(rng, owners, sessions)
                    wires = (wire if kind == "live_then_left" else [wire])[: count - sent - len(batch)]
                    if not _packable({"t": "push", "r": wires}):  # as deep as the message it rides in
                        kind, wires = "unencodable_replaced", [{"session_id": None}]
                    n = len(msgpack.packb(wires, use_bin_type=True))
                    if size + n > BATCH_BYTES:
                        break
                    batch.extend(wires)
                    size += n
                    result["sent_by_kind"][kind] = result["sent_by_kind"].get(kind, 0) + len(wires)
                i = rng.randrange(len(members))
                stream = await members[i].open_stream(peers[i], PROTO_GOSSIP)
                await write_msg(stream, {"t": "push", "r": batch})
                await stream.write_eof()
                await stream.aclose()
                sent += len(batch)
                if ingress.exited() is not None:
                    result["failures"].append(f"ingress exited with {ingress.exited()}")
                    break
            # Let the last pushes land and a GC pass or two run under polling.
            await asyncio.sleep(3.0)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            stats = await mesh.get_json("/dnt/stats")
            for m in members:
                await m.aclose()
        # A record that crashes a handler shows in no view: the ingress's log is where it would.
        log = ingress.log_text()
        if crashes := log.count("Traceback"):
            first = log[log.index("Traceback") :][:300]
            result["failures"].append(f"the ingress logged {crashes} tracebacks, the first: {first!r}")
        registry = stats["registry"]
        result.update(
            records_sent=sent,
            seconds=round(time.perf_counter() - started, 1),
            registry_records_at_end=registry["records"],
            registry_counters={k: v for k, v in sorted(registry.items()) if isinstance(v, int)},
            rss_mib={
                "start": round(rss_start / 2**20, 1),
                "peak": round(max(rss) / 2**20, 1),
                "end": round(rss[-1] / 2**20, 1),
            },
            ingress_alive=ingress.exited() is None,
        )
    result["failure_count"] = len(result["failures"])
    result["failures"] = result["failures"][:20]
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def render_markdown(result: dict[str, Any]) -> str:
    """The summary page."""
    kinds = "\n".join(f"| {k} | {v} |" for k, v in sorted(result["sent_by_kind"].items()))
    counters = "\n".join(f"| {k} | {v} |" for k, v in result["registry_counters"].items())
    rss = result["rss_mib"]
    verdict = (
        "No view ever answered anything but 200 with strict JSON, no routed request a 500, and the ingress "
        "logged no traceback."
        if result["failure_count"] == 0
        else f"**{result['failure_count']} failures**: {result['failures'][:5]}"
    )
    return f"""# Record fuzzing at the registry's door

`python benchmarks/fuzz_records.py --records {result["records_sent"]} --seed {result["seed"]}`: a live ingress
(a real `otela start` process) and one simulated worker; four member hosts push {result["records_sent"]:,}
random and mutated records over gossip, signed by 48 member identities, while a poller reads `/v1/models`,
`/v1/dnt/table`, `/v1/dnt/peers`, `/v1/dnt/stats` and `/v1/health` ({result["polls"]:,} reads), sends
{result["routed"]:,} chat requests for the fuzzed models with QoS constraints (`X-Otela-Require`), and the
ingress's RSS is sampled.
Took {result["seconds"]} s; load average at the end {result["load_average"]}.

**Result.** {verdict} The ingress stayed up: {result["ingress_alive"]}. RSS {rss["start"]} MiB at the start,
{rss["peak"]} MiB at the peak, {rss["end"]} MiB at the end; the registry held
{result["registry_records_at_end"]} records at the end. What bounds it: per member, at most
`max_sessions_per_peer` (8) live sessions of at most `max_record_bytes` (64 KiB) each, `write_rate` writes, and
`max_tombstones_per_signer` (1024) ends of sessions the ingress never saw; most records held at the end are such
tombstones (the *live_then_left* cases), a few hundred bytes each.

What was sent:

| kind | records |
|---|---|
{kinds}

What the ingress's registry counted (`/v1/dnt/stats`, `registry`):

| counter | value |
|---|---|
{counters}

Kinds: *honest* records as real nodes write them (most are refused by the per-peer write rate and session
limits once a member has used its burst); *mutated_signed*, one to three fields or nested values replaced by a
hostile value (wrong type, NaN, infinities, 2^53 and 2^63, huge strings, maps nested 505 deep) and then
validly signed;
*oversized* (10 KB to 200 KB of padding in a model's settings); *left_with_payload*, a LEFT record still
carrying addresses and models; *future*, stamped 10 minutes to 30 years ahead; *wrong_signer*, a member's
record signed by another; *tampered*, changed after signing; *live_then_left*, a valid live record (a third of
them at version 2^53 - 1) followed by its owner's departure or another member's eviction; *garbage*, maps and
values that are not records.
"""


def main() -> int:
    """Run and report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-fuzz-") as tmp:
        result = asyncio.run(fuzz(args.records, args.seed, Path(tmp)))
    result["seed"] = args.seed
    print(json.dumps(result, indent=2))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "fuzz_records.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out_dir / "fuzz_records.md").write_text(render_markdown(result))
    return 0 if result["failure_count"] == 0 and result["ingress_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
