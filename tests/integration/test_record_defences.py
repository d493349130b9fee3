"""A member's records cannot break, flood or outlive their welcome at a live ingress (real processes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from malicious_member import MaliciousMember

from opentela._types import Lifecycle
from opentela.cli.localmesh import OTELA, LocalMesh
from opentela.fabric.identity import Identity
from opentela.registry.record import ModelEntry

pytestmark = pytest.mark.integration

SIM = [*OTELA, "engine", "simulated", "--model", "sim", "--ttft-ms", "1"]
ROOT = Path(__file__).resolve().parents[2]


def strict(text: str) -> Any:
    """JSON as the standard has it: NaN and Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


async def views_answer(mesh: LocalMesh) -> dict[str, Any]:
    """Every read-only view answers 200 with strict JSON; their bodies."""
    out = {}
    for path in ("/models", "/dnt/table", "/dnt/stats", "/health"):
        async with mesh.http().get(mesh.api + path) as resp:
            text = await resp.text()
            assert resp.status == 200, (path, resp.status, text[:300])
            out[path] = strict(text)
    return out


async def counted(mesh: LocalMesh, counter: str, at_least: int) -> int:
    """Wait until the ingress's registry counted `at_least` of `counter`."""

    async def probe() -> int | None:
        value = (await mesh.get_json("/dnt/stats"))["registry"].get(counter, 0)
        return value if value >= at_least else None

    return await mesh.wait_for(probe, timeout=20, what=f"{counter} >= {at_least}")


async def test_malformed_records_are_dropped_and_every_view_still_answers(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.add_worker("worker", SIM, provider="lab-a")
        await mesh.wait_serving("sim", 1, timeout=60)
        async with await MaliciousMember.join(mesh.bootstrap) as m:
            now = time.time()
            bad = [
                m.record(hardware={"cpu": "a string"}),  # made /v1/models answer 500
                m.record(hardware={"gpus": "H100"}),
                m.record(hardware={"gpus": [{"name": "H100", "memory_mib": math.nan}]}),
                m.record(models=(ModelEntry("sim", "simulated", {"context_length": math.inf}),)),
                m.record(updated_at=math.nan),
                m.record(updated_at=math.inf),
                m.record(started_at=-math.inf),
                m.record(version=2**63 - 1),  # its eviction would be written as 2^63
                m.record(updated_at=1e15),  # never garbage-collected
            ]
            await m.push(bad)
            await counted(mesh, "rejected_malformed", len(bad))
            await m.push([m.record(updated_at=now + 3600), m.record(started_at=now + 86400)])
            await counted(mesh, "rejected_future", 2)
            # A LEFT record must be a tombstone: payload in it is refused, a bare one is taken.
            await m.push([m.record(lifecycle=Lifecycle.LEFT, reason="x")])
            await counted(mesh, "rejected_malformed", len(bad) + 1)
            views = await views_answer(mesh)
            table = views["/dnt/table"]
            assert {r["provider_id"] for r in table} == {"ingress", "lab-a"}, table
            assert [m["id"] for m in views["/models"]["data"]] == ["sim"]
            # The worker still serves.
            async with mesh.http().post(
                f"{mesh.api}/chat/completions",
                json={"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            ) as resp:
                assert resp.status == 200, await resp.text()
            # `otela status` reads the same views.
            status = subprocess.run(  # noqa: ASYNC221 (a short CLI call; the mesh runs in other processes)
                [*OTELA, "status", "--ingress", f"http://127.0.0.1:{mesh.http_port}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0, status.stderr


async def test_a_record_at_the_version_bound_can_leave_and_deep_nesting_spoils_nothing(
    tmp_path: Path,
) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.wait_for(lambda: mesh.get_json("/dnt/table"), timeout=30, what="the table")
        async with await MaliciousMember.join(mesh.bootstrap) as m:
            # Hardware nested past Python's recursion limit (msgpack itself allows it): it used to crash the
            # gossip handler, losing the honest record of the same batch and escaping the counters.
            deep: dict[str, Any] = {}
            cursor = deep
            for _ in range(505):
                cursor["x"] = {}
                cursor = cursor["x"]
            honest = m.record(model="honest")
            await m.push([{**m.record().to_wire(), "hardware": deep}, honest])
            await counted(mesh, "rejected_malformed", 1)
            await mesh.wait_for(
                lambda: _row(mesh, honest.session_id), timeout=20, what="the honest record of the batch"
            )
            # A live record at the highest version must still be able to leave: its departure is version 2^53.
            top = m.record(model="top", version=2**53 - 1)
            await m.push([top])
            await mesh.wait_for(
                lambda: _row(mesh, top.session_id), timeout=20, what="the record at the bound"
            )
            departure = top.tombstone().next(m.identity, lifecycle=Lifecycle.LEFT, reason="leaving")
            await m.push([departure])

            async def left() -> dict[str, Any] | None:
                row = await _row(mesh, top.session_id)
                return row if row and row["lifecycle"] == "LEFT" else None

            row = await mesh.wait_for(left, timeout=8, what="the departure at version 2^53")
            assert row["signer"] == m.peer_id and row["version"] == 2**53  # ours, not a probe's eviction
            assert (await mesh.get_json("/dnt/stats"))["registry"]["rejected_malformed"] == 1
            await views_answer(mesh)


async def test_any_allowed_setting_or_text_never_breaks_routing_or_status(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.wait_for(lambda: mesh.get_json("/dnt/table"), timeout=30, what="the table")
        async with await MaliciousMember.join(mesh.bootstrap) as m:
            # `gpu: 1` is a scalar the schema allows; QoS matching by GPU name used to answer 500 on it.
            # A provider id of "[/]" is a valid string, and used to crash `otela status` as console markup.
            odd = m.record(
                provider_id="[/]", models=(ModelEntry("odd", "[bold]", {"gpu": 1, "quantization": 4}),)
            )
            await m.push([odd])
            await mesh.wait_for(lambda: _row(mesh, odd.session_id), timeout=20, what="the record")
            body = {"model": "odd", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            for require in ("gpu=H100", "gpu!=H100", "quantization<=8", "gpu_memory>=1GiB"):
                async with mesh.http().post(
                    f"{mesh.api}/chat/completions", json=body, headers={"X-Otela-Require": require}
                ) as resp:
                    text = await resp.text()
                    assert resp.status < 500 or resp.status in (502, 503), (require, resp.status, text[:300])
                    assert "error" in strict(text), text[:300]
            await views_answer(mesh)
            status = subprocess.run(  # noqa: ASYNC221 (a short CLI call; the mesh runs in other processes)
                [*OTELA, "status", "--ingress", f"http://127.0.0.1:{mesh.http_port}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0 and "[/]" in status.stdout, status.stderr[-2000:]


async def _row(mesh: LocalMesh, session_id: str) -> dict[str, Any] | None:
    """The table row of `session_id`, if the ingress has it."""
    return next((r for r in await mesh.get_json("/dnt/table") if r["session_id"] == session_id), None)


async def test_oversized_records_and_session_floods_are_bounded(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.wait_for(lambda: mesh.get_json("/dnt/table"), timeout=30, what="the table")
        async with await MaliciousMember.join(mesh.bootstrap) as m:
            padding = {f"pad{k}": "p" * 250 for k in range(20)}  # every setting within its own bounds
            huge = m.record(models=tuple(ModelEntry(f"m{i}", "simulated", padding) for i in range(60)))
            await m.push([huge])  # 300 KB in all (3.5 MB in the original finding)
            await counted(mesh, "rejected_malformed", 1)
            flood = [m.record(model=f"flood-{i}") for i in range(300)]
            for start in range(0, len(flood), 50):
                await m.push(flood[start : start + 50])
            limited = await counted(mesh, "rejected_session_limit", 300 - 8)
            assert limited == 300 - 8  # the default: 8 live sessions per peer
            views = await views_answer(mesh)
            mine = [r for r in views["/dnt/table"] if r["peer_id"] == m.peer_id]
            assert len(mine) == 8
            # Rewriting the same session over and over: the write rate bounds what is taken.
            session = mine[0]["session_id"]
            versions = [m.record(session_id=session, model="again", version=v) for v in range(2, 202)]
            await m.push(versions[:100])
            await m.push(versions[100:])
            rate_limited = await counted(mesh, "rejected_write_rate", 100)
            assert rate_limited <= 200
            stats = (await mesh.get_json("/dnt/stats"))["registry"]
            assert stats["records"] <= 1 + 8 + 1  # the ingress, the flood's 8 and nothing else


async def test_evictions_of_sessions_never_seen_are_capped_per_signer(tmp_path: Path) -> None:
    async with LocalMesh(tmp_path) as mesh:
        await mesh.start_ingress()
        await mesh.wait_for(lambda: mesh.get_json("/dnt/table"), timeout=30, what="the table")
        async with await MaliciousMember.join(mesh.bootstrap) as m:
            await m.push([m.record()])  # a member: its evictions are not refused as a stranger's
            await mesh.wait_for(lambda: _peer_rows(mesh, m.peer_id), timeout=20, what="the member's record")
            # Ends of sessions of made-up peers: they passed every per-owner limit, each a week of weight.
            ghosts = [MaliciousMember(Identity.generate(), m.host, m.peer) for _ in range(1100)]
            endings = [m.eviction(g.record(model="ghost")) for g in ghosts]
            for start in range(0, len(endings), 250):
                await m.push(endings[start : start + 250])
            refused = await counted(mesh, "rejected_tombstone_limit", 1100 - 1024)
            assert refused == 1100 - 1024  # the default: 1024 tombstones per signer
            table = (await views_answer(mesh))["/dnt/table"]
            assert sum(1 for r in table if r["signer"] == m.peer_id and r["lifecycle"] == "LEFT") == 1024


async def _peer_rows(mesh: LocalMesh, peer_id: str) -> list[dict[str, Any]] | None:
    """The table rows of `peer_id`'s sessions, None when there are none."""
    return [r for r in await mesh.get_json("/dnt/table") if r["peer_id"] == peer_id] or None


async def test_fuzzed_records_never_break_a_view(tmp_path: Path) -> None:
    out = tmp_path / "fuzz"
    done = subprocess.run(  # noqa: ASYNC221 (the fuzzer runs its own event loop; nothing else runs here)
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fuzz_records.py"),
            "--records",
            "2000",
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "fuzz_records.json").read_text())
    assert result["failure_count"] == 0 and result["records_sent"] == 2000
    assert result["registry_counters"]["rejected_malformed"] > 0
    assert result["polls"] > 0 and result["routed"] > 0
