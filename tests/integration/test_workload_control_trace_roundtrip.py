"""The trace round trip: usage rows in a frontend -> its HTTP export -> `read_trace` -> the trace analysis ->
`otela bench load --trace --speedup --record` against a mesh of simulated engines, whose executed arrivals keep the
original inter-arrival distribution (two-sample Kolmogorov-Smirnov test at alpha = 0.01)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from opentela.bench.trace_analysis import analyze
from opentela.bench.traces import read_trace
from opentela.cli.localmesh import OTELA, LocalMesh
from opentela.frontend import Frontend, FrontendConfig
from opentela.frontend.keys import KeySettings
from opentela.frontend.usage import Outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "sim-trace"
TOKEN = "roundtrip-admin-token"
REQUESTS = 200
RATE = 2.0
"""Requests per second of the recorded Poisson process (100 s of usage)..."""
SPEEDUP = 20.0
"""...replayed 20 times faster: 5 s, 25 ms between requests on average."""
ALPHA = 0.01


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: int, m: int, alpha: float = ALPHA) -> float:
    """The statistic's critical value for samples of `n` and `m` (asymptotic: c(alpha) sqrt((n+m)/(n m)))."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


async def seed_usage(frontend: Frontend, times: np.ndarray, inputs: np.ndarray, outputs: np.ndarray) -> None:
    """One completed usage row per request, admitted at its time through the ledger's clock."""
    ledger = frontend.state.ledger
    key, _ = await frontend.state.keys.create(KeySettings(name="trace"))
    for i, (t, n_in, n_out) in enumerate(zip(times, inputs, outputs, strict=True)):
        ledger.clock = lambda t=float(t): t
        admission = await ledger.admit(
            key,
            request_id=f"r-{i}",
            endpoint="/v1/chat/completions",
            model=MODEL,
            stream=True,
            input_estimate=int(n_in),
            sampling={"max_tokens": int(n_out)},
        )
        ledger.clock = lambda t=float(t): t + 0.05
        await ledger.complete(
            admission, Outcome("ok", 200, "lab", "node", int(n_in), int(n_out), ttft_ms=10.0)
        )


async def test_exported_usage_replays_with_its_inter_arrival_distribution(tmp_path: Path) -> None:
    rng = np.random.default_rng(2026)
    gaps = rng.exponential(1 / RATE, REQUESTS - 1)
    times = time.time() - 600 + np.concatenate([[0.0], np.cumsum(gaps)])
    inputs = rng.integers(20, 400, REQUESTS)
    outputs = rng.integers(2, 12, REQUESTS)
    export = tmp_path / "export.csv"
    async with LocalMesh(tmp_path / "mesh") as mesh:
        await mesh.start_ingress()
        engine = [*OTELA, "engine", "simulated", "--model", MODEL, "--ttft-ms", "1", "--itl-ms", "1"]
        await mesh.add_worker("sim", engine)  # starts while the usage is seeded
        frontend = await Frontend.create(
            FrontendConfig(ingress=mesh.api),
            db_url=f"sqlite:///{tmp_path / 'frontend.db'}",
            admin_token=TOKEN,
            instance="roundtrip",
        )
        try:
            await frontend.start("127.0.0.1", 0)
            await seed_usage(frontend, times, inputs, outputs)
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    frontend.url + "/admin/usage/export.csv", headers={"Authorization": f"Bearer {TOKEN}"}
                ) as resp,
            ):
                assert resp.status == 200, await resp.text()
                export.write_bytes(await resp.read())
        finally:
            await frontend.aclose()

        # The export reads back as the requests that were recorded, and the analysis sees their traffic.
        records = read_trace(export)
        assert [r.model for r in records] == [MODEL] * REQUESTS
        assert np.allclose([r.timestamp for r in records], times, rtol=0, atol=1e-3)
        assert [(r.input_tokens, r.output_tokens) for r in records] == list(zip(inputs, outputs, strict=True))
        analysis = analyze(records)
        assert analysis.requests == REQUESTS
        (ranked,) = analysis.ranking.models
        assert (ranked.model, ranked.tokens) == (MODEL, int(inputs.sum() + outputs.sum()))
        assert REQUESTS / (analysis.end - analysis.start) == pytest.approx(RATE, rel=0.2)
        assert analysis.lengths.input_p50 == pytest.approx(np.median(inputs), abs=10)
        assert analysis.lengths.output_p50 == pytest.approx(np.median(outputs), abs=1)

        # Replay through the real command, which records what it actually sent.
        await mesh.wait_serving(MODEL, 1, timeout=60)
        executed, report_file = tmp_path / "executed.csv", tmp_path / "report.json"
        proc = await asyncio.create_subprocess_exec(
            *OTELA,
            "bench",
            "load",
            *("--url", mesh.api, "--model", MODEL, "--trace", str(export), "--speedup", str(SPEEDUP)),
            *("--record", str(executed), "--out", str(report_file), "--no-progress"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]

    report = json.loads(report_file.read_text())
    assert report["completed"] == REQUESTS and report["failed"] == 0
    replayed = read_trace(executed)
    assert len(replayed) == REQUESTS and {r.model for r in replayed} == {MODEL}
    assert sorted(r.max_tokens for r in replayed) == sorted(int(n) for n in outputs)
    sent = np.array([r.timestamp for r in replayed])
    original = np.diff([r.timestamp for r in records]) / SPEEDUP
    critical = ks_critical(REQUESTS - 1, REQUESTS - 1)  # 0.163 for 199 gaps each
    lag = sent - (np.array([r.timestamp for r in records]) - records[0].timestamp) / SPEEDUP
    statistic = ks_statistic(np.diff(sent), original)
    assert statistic < critical, (
        f"D = {statistic:.3f}, critical {critical:.3f}, send lag p99 {np.quantile(lag, 0.99):.4f} s"
    )
    # The test has the power to see a replay that ignored the speedup.
    assert ks_statistic(np.diff(sent), original * SPEEDUP) > critical
