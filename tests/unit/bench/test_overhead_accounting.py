"""benchmarks/overhead.py's accounting: added latency in hops, py-spy's collapsed stacks per request, the report."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from opentela.cli.localmesh import free_port

ROOT = Path(__file__).resolve().parents[3]


def _overhead():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("overhead_bench", ROOT / "benchmarks" / "overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["overhead_bench"] = module
    spec.loader.exec_module(module)
    return module


overhead = _overhead()


def test_added_latency_is_counted_in_hops_of_the_same_run(monkeypatch) -> None:
    monkeypatch.setattr(overhead, "ENGINE_MS", 2.0)
    direct = [0.0035] * 100  # 3.5 ms: the engine's 2 ms plus a 1.5 ms hop
    via = [0.0035 + 0.0030] * 99 + [0.0035 + 0.0045]
    res = overhead.summarize("mesh", via, direct, [])
    assert res["hop_ms"] == 1.5
    assert res["added_p50_ms"] == 3.0 and res["added_p50_hops"] == 2.0
    assert res["added_p99_hops"] == 2.0  # the 99th of 100 samples by nearest rank


def test_collapsed_stacks_become_cpu_time_per_request(tmp_path) -> None:
    raw = tmp_path / "ingress.txt"
    raw.write_text(
        "main (a.py:1);run (a.py:2);parse (b.py:3) 300\n"
        "main (a.py:1);run (a.py:2);write (c.py:4) 100\n"
        "main (a.py:1);parse (b.py:3) 100\n"
    )
    out = overhead.collapsed_breakdown(raw, requests=100)
    # 500 samples at 1 kHz over 100 requests: 5 ms of CPU per request, 4 of them in parse.
    assert out["cpu_ms_per_request"] == 5.0 and out["samples"] == 500
    assert out["top_self"][0] == {"function": "parse (b.py:3)", "ms_per_request": 4.0}
    assert out["top_self"][1]["ms_per_request"] == 1.0


def test_the_report_judges_hops_and_litellm() -> None:
    seq = {
        "path": "mesh", "requests": 10, "added_p50_ms": 1.8, "added_p99_ms": 2.5, "hop_ms": 1.5,
        "added_p50_hops": 1.2, "added_p99_hops": 1.667,
    }  # fmt: skip
    litellm = {"path": "litellm", "added_p50_ms": 19.0, "added_p99_ms": 25.0}
    result = {
        "sequential": [seq, litellm],
        "open_loop": [],
        "header_bytes": {"request_bytes": 135, "response_bytes": 66},
        "machine": {"loadavg_start": [0.5], "loadavg_end": [0.7], "cpus": 2},
    }
    text = "\n".join(overhead._verdict(result))
    assert "| added p50 sequential, in hops (hop 1.5 ms, same run) | <= 1.3 hops | 1.2 | met |" in text
    assert "10.6 lower p50, met" in text
    assert "the floor" not in text
    floor = {"path": overhead.FLOOR, "added_p50_ms": 0.3, "added_p99_ms": 0.5, "added_p50_hops": 0.2}
    result["sequential"].append(floor)
    text = "\n".join(overhead._verdict(result))
    expected = "two bare byte relays (same run) | - | 0.3 / 0.5 ms added p50 / p99 = 0.2 hops | mesh above it: 1.5 ms"
    assert expected in text


async def test_two_byte_relays_carry_http_both_ways_on_kept_alive_connections() -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"got": len(await request.read()), "peer": request.remote})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with overhead.byte_relays(port) as relay_port, aiohttp.ClientSession() as http:
            path = overhead.Path_(overhead.FLOOR, f"http://127.0.0.1:{relay_port}/v1/chat/completions")
            for _ in range(3):
                elapsed, _stages = await path.post(http)
                assert 0 < elapsed < 5
            async with http.post(path.url, data=b"x" * 70_000) as resp:
                assert (await resp.json())["got"] == 70_000
            assert len(http.connector._conns) == 1  # type: ignore[union-attr]  # one pooled connection, reused
    finally:
        await runner.cleanup()


class _FixedPath(overhead.Path_):
    """A path that answers in a fixed time, without a network: what open_loop_paths pairs is the subject."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name, "http://unused")
        self.seconds = seconds

    async def post(self, http):  # type: ignore[no-untyped-def, override]
        return self.seconds, {}


async def test_each_build_is_measured_against_its_own_engine_when_directs_are_paired(monkeypatch) -> None:
    monkeypatch.setattr(overhead, "ENGINE_MS", 2.0)
    new, base = _FixedPath("mesh", 0.0050), _FixedPath("baseline", 0.0070)
    own_new, own_base = _FixedPath("direct", 0.0030), _FixedPath("direct-baseline", 0.0040)
    paired = await overhead.open_loop_paths(None, [new, base], [own_new, own_base], 400.0, 0.1)  # type: ignore[arg-type]
    assert [round(r["added_p50_ms"], 3) for r in paired] == [2.0, 3.0]
    shared = await overhead.open_loop_paths(None, [new, base], own_new, 400.0, 0.1)  # type: ignore[arg-type]
    assert [round(r["added_p50_ms"], 3) for r in shared] == [2.0, 4.0]


class _LoggedPath(_FixedPath):
    """A fixed-time path that writes its name into a shared log on each request."""

    def __init__(self, name: str, seconds: float, log: list[str]) -> None:
        super().__init__(name, seconds)
        self.log = log

    async def post(self, http):  # type: ignore[no-untyped-def, override]
        self.log.append(self.name)
        return self.seconds, {}


async def test_paired_closed_loop_never_puts_two_proxies_back_to_back() -> None:
    log: list[str] = []
    direct = _LoggedPath("direct", 0.003, log)
    vias = [
        _LoggedPath("mesh", 0.004, log),
        _LoggedPath("relays", 0.0031, log),
        _LoggedPath("litellm", 0.013, log),
    ]
    out = await overhead.paired_closed_loop(None, direct, vias, 120, block=50)  # type: ignore[arg-type]
    for name, (via, _stages, own_direct) in out.items():
        assert len(via) == len(own_direct) == 120, name
    assert out["litellm"][0][0] == 0.013 and set(out["mesh"][2]) == {0.003}
    assert len(log) == 2 * 3 * 120
    proxies = [name for name in log if name != "direct"]
    # Two different proxies never follow one another: each has only direct calls or itself beside it.
    assert all(a == b or "direct" in (a, b) for a, b in itertools.pairwise(log))
    runs = [proxies[i] for i in range(len(proxies)) if i == 0 or proxies[i] != proxies[i - 1]]
    assert runs == ["mesh", "relays", "litellm", "relays", "litellm", "mesh", "litellm", "mesh", "relays"]


def test_the_one_rotation_comparison_sits_beside_the_blocks() -> None:
    mesh = {"path": "mesh", "requests": 300, "added_p50_ms": 1.1, "added_p99_ms": 1.6}
    result = {
        "sequential": [mesh],
        "sequential_one_rotation": [
            {"path": "mesh", "requests": 300, "added_p50_ms": 1.4, "added_p99_ms": 2.0}
        ],
    }
    assert "| mesh | 300 | 1.4 | 1.1 | 2.0 | 1.6 |" in overhead._rotation_lines(result)
    assert overhead._rotation_lines({"sequential": [mesh]}) == []


async def test_open_loop_paths_are_independent_streams_unless_sent_together() -> None:
    log: list[str] = []
    via, direct = _LoggedPath("mesh", 0.004, log), _LoggedPath("direct", 0.003, log)
    await overhead.open_loop_paths(None, [via], direct, 400.0, 0.5, seed=3)  # type: ignore[arg-type]
    counts = {name: log.count(name) for name in ("mesh", "direct")}
    assert all(120 <= n <= 280 for n in counts.values()), counts  # each about 400 req/s x 0.5 s
    pairs = [set(log[i : i + 2]) for i in range(0, len(log) - 1, 2)]
    assert any(len(p) == 1 for p in pairs)  # the same path twice in a row: arrivals are not paired
    log.clear()
    res = await overhead.open_loop_paths(None, [via], direct, 400.0, 0.5, seed=3, together=True)  # type: ignore[arg-type]
    assert log.count("mesh") == log.count("direct") and res[0]["layout"] == "together"
    assert all(len(set(log[i : i + 2])) == 2 for i in range(0, len(log), 2))  # every arrival sent on both
