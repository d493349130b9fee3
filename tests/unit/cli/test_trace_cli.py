"""`otela trace analyze` and `otela trace synthesize` end to end on a small synthetic trace."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from opentela.bench.trace_plots import FIGURES
from opentela.cli.main import main

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
SMALL = ("--requests", "3000", "--days", "7", "--seed", "5")


def test_analyze_synthetic_prints_tables_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert main(["trace", "analyze", "--synthetic", *SMALL, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    for title in ("Fig. 9", "Fig. 10", "Fig. 12", "Fig. 13", "Fig. 14", "Fig. 15"):
        assert title in captured.out
    assert "Llama-3.3-70B-Instruct" in captured.out and "173.58" in captured.out
    assert "generating a synthetic trace" in captured.err and "wrote" in captured.err
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page and "Reusable prefix ratio" in page
    # The test extras may come without Matplotlib (the `bench` extra): then the report says why it has no plots.
    if HAVE_MATPLOTLIB:
        assert sorted(p.name for p in out.glob("*.png")) == sorted(f"{name}.png" for name in FIGURES)
        assert page.count('src="data:image/png;base64,') == len(FIGURES)
        assert all((out / f"{name}.png").read_bytes().startswith(b"\x89PNG") for name in FIGURES)
    else:
        assert "pip install" in page and not list(out.glob("*.png"))


def test_without_matplotlib_the_report_keeps_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now raises ImportError
    out = tmp_path / "report"
    assert main(["trace", "analyze", "--synthetic", *SMALL, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Matplotlib" in err and "opentela[bench]" in err
    page = (out / "report.html").read_text()
    assert "<table>" in page and "data:image/png" not in page and "opentela[bench]" in page
    assert not list(out.glob("*.png"))


def test_synthesize_then_analyze_the_file_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "synthetic.jsonl"
    assert main(["trace", "synthesize", "--out", str(trace), *SMALL]) == 0
    assert len(trace.read_text().splitlines()) == 3000
    capsys.readouterr()
    argv = ["trace", "analyze", str(trace), "--json", "--no-plots", "--window", "all", "--model", "Qwen3-32B"]
    assert main([*argv, "--out", str(tmp_path / "none")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["requests"] == 3000
    assert doc["models"]["tiers"] and doc["latency"]["reasoning"]["e2e_p95"] == pytest.approx(173.58)
    assert doc["prefix_reuse"]["window_s"] is None
    assert doc["figure_models"]["ratio"] == ["Qwen3-32B"] and doc["output_ratio"][0]["model"] == "Qwen3-32B"
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["trace", "analyze", "missing.csv"], "no trace file at missing.csv"),
        (["trace", "analyze"], "needs a trace FILE"),
        (["trace", "analyze", "bad.csv"], "bad.csv"),
        (["trace", "analyze", "--synthetic", "--window", "soon"], "--window"),
        (["trace", "analyze", "--synthetic", "--requests", "0"], "at least 1"),
        (
            ["trace", "analyze", "--synthetic", "--requests", "50", "--model", "nope"],
            "'nope' is not in the trace",
        ),
    ],
)
def test_clear_errors(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("timestamp,model,input_tokens,output_tokens\nyesterday,m,x,1\n")
    assert main([*argv, "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "otela: error:" in err and message in err
