"""The load generator: workload plans, report arithmetic, and a real run against a simulated engine."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from opentela.bench.load import LoadSettings, run_load
from opentela.bench.report import Outcome, build_report, percentile
from opentela.bench.workload import LengthDistribution, PlannedRequest, poisson_plan, trace_plan
from opentela.engines.simulated import SimulatedConfig, SimulatedServer
from opentela.errors import ConfigError


def test_length_specs() -> None:
    rng = random.Random(1)
    assert LengthDistribution.parse("128").draw(rng) == 128
    draws = [LengthDistribution.parse("uniform:10:20").draw(rng) for _ in range(500)]
    assert min(draws) >= 10 and max(draws) <= 20
    mean = sum(LengthDistribution.parse("exp:100").draw(rng) for _ in range(4000)) / 4000
    assert 90 < mean < 110
    assert LengthDistribution.parse("lognormal:50:0.5").draw(rng) >= 1
    for bad in ("x", "uniform:1", "gamma:1:2", "exp:-3"):
        with pytest.raises(ConfigError):
            LengthDistribution.parse(bad)


def test_poisson_plan_has_the_asked_rate() -> None:
    fixed = LengthDistribution.parse("8")
    plan = list(poisson_plan(50, fixed, fixed, random.Random(3), duration=100))
    assert 4700 < len(plan) < 5300
    assert all(b.at >= a.at for a, b in itertools.pairwise(plan))
    assert len(list(poisson_plan(5, fixed, fixed, random.Random(3), count=7))) == 7


def test_trace_plan_shifts_and_speeds_up(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1000.0, "input_tokens": 10, "output_tokens": 5},
        {"timestamp": 1004.0, "prompt_tokens": 20, "completion_tokens": 6},
        {"timestamp": 1002.0, "input_len": 30, "output_len": 7},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    plan = trace_plan(trace, speedup=2)
    assert plan == [PlannedRequest(0.0, 10, 5), PlannedRequest(1.0, 30, 7), PlannedRequest(2.0, 20, 6)]
    trace.write_text('{"timestamp": 1}\n')
    with pytest.raises(ConfigError):
        trace_plan(trace)


def test_report_percentiles_throughput_and_errors() -> None:
    outcomes = [
        Outcome(sent_at=i * 0.1, ok=True, ttft=0.01 * i, e2e=0.1, output_tokens=11) for i in range(1, 101)
    ]
    outcomes.append(Outcome(sent_at=0.5, ok=False, status=503, error="no_healthy_replica", e2e=0.001))
    report = build_report(outcomes, 10.0, {})
    assert report["completed"] == 100 and report["failed"] == 1
    assert report["errors"] == {"no_healthy_replica": 1}
    assert report["ttft_ms"]["p50"] == 500.0 and report["ttft_ms"]["p99"] == 990.0
    assert report["throughput"]["output_tokens_per_s"] == 110.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert sum(s["completed"] for s in report["timeline"]) == 100


@pytest.mark.parametrize("stream", [True, False])
async def test_run_against_a_simulated_engine(stream: bool) -> None:
    async with SimulatedServer(SimulatedConfig(model="m", ttft_ms=5, itl_ms=2)) as srv:
        settings = LoadSettings(url=srv.base_url + "/v1", model="m", stream=stream)
        plan = [PlannedRequest(i * 0.01, 40, 6) for i in range(10)]
        outcomes, elapsed = await run_load(plan, settings, total=10, progress=False)
    report = build_report(outcomes, elapsed, {})
    assert report["completed"] == 10, report["errors"]
    assert report["throughput"]["output_tokens_per_s"] > 0
    assert report["ttft_ms"]["p50"] <= report["e2e_ms"]["p50"]
    if stream:
        assert all(o.output_tokens == 6 and len(o.itls) == 5 for o in outcomes)
        assert report["tpot_ms"] is not None and report["itl_ms"] is not None


async def test_failures_are_counted_by_kind() -> None:
    async with SimulatedServer(SimulatedConfig(model="m", ttft_ms=1, itl_ms=1, errors="503=1.0")) as srv:
        settings = LoadSettings(url=srv.base_url + "/v1", model="m")
        outcomes, elapsed = await run_load([PlannedRequest(0, 4, 2)] * 3, settings, total=3, progress=False)
    report = build_report(outcomes, elapsed, {})
    assert report["failed"] == 3 and report["errors"] == {"simulated_error": 3}


async def test_a_stream_cut_without_its_done_event_is_an_error() -> None:
    """A stand-in server (not an engine) sends two content events and ends the body cleanly without [DONE]."""
    from aiohttp import web

    from loopback_http import serve_app

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("a", "b"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", cut)
    async with serve_app(app) as url:
        settings = LoadSettings(url=url + "/v1", model="m", stream=True)
        outcomes, _ = await run_load([PlannedRequest(0, 4, 2)], settings, total=1, progress=False)
    assert [(o.ok, o.error) for o in outcomes] == [(False, "stream_truncated")]


def test_cli_runs_against_an_engine_process(tmp_path: Path) -> None:
    """`otela bench load` end to end: a simulated engine process, the command, its JSON report."""
    import subprocess
    import sys

    from opentela.engines.base import free_port

    port = free_port()
    engine = subprocess.Popen(
        [sys.executable, "-m", "opentela", "engine", "simulated", "--port", str(port), "--ttft-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert engine.stdout is not None
        assert b"listening on" in engine.stdout.readline()
        out = tmp_path / "report.json"
        done = subprocess.run(
            [
                sys.executable, "-m", "opentela", "bench", "load", "--url", f"http://127.0.0.1:{port}/v1",
                "--model", "sim-model", "--rate", "50", "--requests", "8", "--output-len", "uniform:2:6",
                "--no-progress", "--out", str(out),
            ],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(out.read_text())
        assert report["completed"] == 8 and report["failed"] == 0
        assert json.loads(done.stdout)["requests"] == 8
        assert report["settings"]["loadavg"]
    finally:
        engine.terminate()
        engine.wait(10)
        engine.stdout.close()  # type: ignore[union-attr]


def test_distinct_prompts_share_no_prefix_and_replay_the_same() -> None:
    from opentela.bench.workload import COMMON_WORDS

    shared = LoadSettings(url="http://127.0.0.1:1/v1", model="m", endpoint="completions")
    distinct = LoadSettings(
        url="http://127.0.0.1:1/v1", model="m", endpoint="completions", distinct_prompts=True
    )
    a, b = PlannedRequest(0.0, 200, 8), PlannedRequest(0.5, 200, 8)
    assert shared.body(a)["prompt"] == shared.body(b)["prompt"]  # one repeated word: a prefix cache hits
    first, second = distinct.body(a)["prompt"].split(), distinct.body(b)["prompt"].split()
    assert len(first) == len(second) == 200 and set(first) | set(second) <= set(COMMON_WORDS)
    common = next(i for i, (x, y) in enumerate(zip(first, second, strict=True)) if x != y)
    assert common < 8  # random words: the two prompts part within a few words
    assert distinct.body(a)["prompt"] == distinct.body(PlannedRequest(0.0, 200, 8))["prompt"]
