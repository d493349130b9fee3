"""Traces into the scheduler: workloads derived from a trace, the simulator's Trace, and the CLI's --trace flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from opentela.bench.traces import TraceRecord, write_trace
from opentela.cli.controller import catalog_with_trace
from opentela.cli.main import main
from opentela.errors import ConfigError
from opentela.scheduler.fleet_catalog import parse_fleet_catalog
from opentela.scheduler.workload import LengthDist, trace_from_records, workloads_from_trace


def _poisson(
    model: str, rate: float, seconds: float, median: tuple[int, int], seed: int
) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    times = times[times < seconds]
    inp = rng.lognormal(np.log(median[0]), 0.8, times.size)
    out = rng.lognormal(np.log(median[1]), 1.0, times.size)
    return [TraceRecord(float(t), model, int(i), int(o)) for t, i, o in zip(times, inp, out, strict=True)]


def test_workloads_recover_rates_and_median_lengths() -> None:
    records = sorted(
        _poisson("chat", 3.0, 2000, (400, 120), 1) + _poisson("guard", 0.5, 2000, (900, 2), 2),
        key=lambda r: r.timestamp,
    )
    workloads = workloads_from_trace(records)
    # One workload per model, in order of first appearance.
    assert [w.model for w in workloads] == list(dict.fromkeys(r.model for r in records))
    by_name = {w.model: w for w in workloads}
    assert by_name["chat"].rate == pytest.approx(3.0, rel=0.05)
    assert by_name["guard"].rate == pytest.approx(0.5, rel=0.1)
    assert by_name["chat"].input.median == pytest.approx(400, rel=0.05)
    assert by_name["chat"].output.median == pytest.approx(120, rel=0.08)
    assert by_name["guard"].output.median == pytest.approx(2, abs=1)
    # Draws follow the trace's lengths, not a normal fitted to their mean.
    drawn = by_name["chat"].input.sample(np.random.default_rng(0), 20000)
    assert np.median(drawn) == pytest.approx(400, rel=0.05)
    assert by_name["chat"].input.mean == pytest.approx(
        np.mean([r.input_tokens for r in records if r.model == "chat"])
    )
    assert workloads_from_trace(records, speedup=2)[0].rate == pytest.approx(
        2 * workloads_from_trace(records)[0].rate
    )


def test_empirical_lengths_keep_a_spike_of_one_token_answers() -> None:
    lengths = [1] * 300 + list(range(400, 1100))
    dist = LengthDist.empirical(lengths)
    drawn = dist.sample(np.random.default_rng(3), 50000)
    assert np.mean(drawn == 1) == pytest.approx(0.3, abs=0.02)
    assert drawn.max() <= 1099 and dist.median == pytest.approx(np.median(lengths))
    assert LengthDist(512.0).median == 512.0


def test_a_trace_too_short_for_a_rate_is_an_error() -> None:
    with pytest.raises(ConfigError, match="at least two requests"):
        workloads_from_trace([TraceRecord(1.0, "m", 1, 1)])
    with pytest.raises(ConfigError, match="all arrive at once"):
        workloads_from_trace([TraceRecord(1.0, "m", 1, 1), TraceRecord(1.0, "n", 1, 1)])


def test_model_names_become_indices() -> None:
    records = [TraceRecord(100.0, "b", 1, 2), TraceRecord(101.0, "a", 3, 4), TraceRecord(102.0, "b", 5, 6)]
    trace = trace_from_records(records)
    assert trace.arrival.tolist() == [0.0, 1.0, 2.0] and trace.model.tolist() == [0, 1, 0]
    chosen = trace_from_records(records, {"a": 3})
    assert (
        chosen.model.tolist() == [3] and chosen.input_len.tolist() == [3] and chosen.arrival.tolist() == [0.0]
    )
    # Old arrival,input,output,model files name models by index: they keep it.
    legacy = trace_from_records([TraceRecord(0.0, "2", 1, 1), TraceRecord(1.0, "0", 1, 1)])
    assert legacy.model.tolist() == [2, 0]


def test_simulate_replays_one_model_of_a_burstgpt_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "BurstGPT.csv"
    trace.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "0,ChatGPT,100,10,110,Conversation log\n"
        "1,GPT-4,200,20,220,Conversation log\n"
        "2,ChatGPT,300,30,330,Conversation log\n"
    )
    argv = ["simulate", "--model", "Qwen3-1.7B", "--gpu", "L40S", "--trace", str(trace), "--json"]
    assert main([*argv, "--trace-model", "ChatGPT", "--speedup", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["requests"] == 2
    assert main([*argv, "--trace-model", "Claude"]) == 2
    assert "no requests of the chosen models" in capsys.readouterr().err


def test_plan_takes_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = sorted(_poisson("qwen", 4.0, 300, (300, 100), 5), key=lambda r: r.timestamp)
    trace = tmp_path / "trace.jsonl"
    write_trace(records, trace)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("devices:\n  L40S: 2\n")
    argv = ["plan", "--cluster", str(cluster), "--trace", str(trace), "--trace-model", "qwen=Qwen3-1.7B"]
    fast = ["--sim-duration", "5", "--shares", "5", "--table-points", "4", "--baseline", "none", "--json"]
    assert main([*argv, *fast, "--speedup", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (workload,) = doc["workload"]
    assert workload["model"] == "Qwen3-1.7B" and workload["rate"] == pytest.approx(8.0, rel=0.1)
    assert set(doc["plans"][0]["allocation"]) == {"Qwen3-1.7B"}
    assert main([*argv, "--workload", str(trace)]) == 2
    assert "either --workload FILE or --trace FILE" in capsys.readouterr().err


def test_the_controller_takes_its_catalog_traffic_from_a_trace() -> None:
    catalog = parse_fleet_catalog(
        {
            "models": [
                {"id": "org/Small", "config": "SmolLM2-135M-Instruct", "command": "x --port {port}",
                 "workload": {"rate": 2}},
                {"id": "qwen", "config": "Qwen3-1.7B", "command": "x --port {port}", "workload": {"rate": 0.5}},
            ]
        }
    )  # fmt: skip
    records = [TraceRecord(float(t), "org/Small", 100 + t, 10) for t in range(11)]
    records += [TraceRecord(float(t), "Qwen3-1.7B", 50, 5) for t in range(0, 10, 5)]
    small, qwen = catalog_with_trace(catalog, records, speedup=3).models
    # Matched by served id, or else by config name; the placement's name stays the config.
    assert small.workload.model == "SmolLM2-135M-Instruct" and small.workload.rate == pytest.approx(3.3)
    assert small.workload.input.median == 105 and qwen.workload.rate == pytest.approx(0.6)
    unmatched = catalog_with_trace(
        catalog, [TraceRecord(0.0, "other", 1, 1), TraceRecord(1.0, "other", 1, 1)]
    )
    assert unmatched.models == catalog.models


def test_the_controller_reads_its_trace_before_joining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "models:\n  - {id: qwen, config: Qwen3-1.7B, command: 'x --port {port}', workload: {rate: 1}}\n"
    )
    key = str(tmp_path / "controller.key")
    argv = ["controller", "--key-file", key, "--catalog", str(catalog), "--trace", str(tmp_path / "none.csv")]
    assert main(argv) == 2
    assert "cannot read trace" in capsys.readouterr().err
