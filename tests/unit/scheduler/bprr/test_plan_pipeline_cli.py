"""`otela plan --pipeline`: placement and per-token times from a servers file and a measured RTT matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opentela.cli.main import main

PIPELINE = """\
model: Llama-2-13b
input_len: 20
output_len: 64
servers:
  - {name: big, gpu: A100-80G}
  - {name: half-1, memory_gib: 12, tau_decode_ms: 2, tau_prefill_ms: 8}
  - {name: half-2, memory_gib: 12, tau_decode_ms: 2, tau_prefill_ms: 8}
clients: [near, far]
requests: 2
rtt_ms: 40
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    return path


def _plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_measured_rtts_steer_each_client_to_its_nearby_servers(
    pipeline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rtt = tmp_path / "rtt.csv"
    rtt.write_text(",big,half-1,half-2\nnear,2,300,300\nfar,400,3,3\n")
    doc = _plan(["--pipeline", str(pipeline), "--rtt", str(rtt)], capsys)
    assert doc["algorithm"] == "cg-bprr" and doc["status"] == "feasible" and doc["n_blocks"] == 40
    chains = {c["client"]: c for c in doc["chains"]}  # type: ignore[attr-defined]
    assert [hop[0] for hop in chains["near"]["hops"]] == ["big"]
    assert [hop[0] for hop in chains["far"]["hops"]][:2] == ["half-1", "half-2"]
    for chain in chains.values():
        assert chain["hops"][0][1] == 0 and chain["hops"][-1][2] == 40
        assert 0 < chain["per_token_s"] < chain["first_token_s"]


@pytest.mark.parametrize("algorithm", ["cg-bp", "petals"])
def test_other_planners_print_a_covering_placement(
    algorithm: str, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _plan(["--pipeline", str(pipeline), "--algorithm", algorithm, "--rate", "0.5"], capsys)
    assert doc["algorithm"] == algorithm and doc["status"] == "feasible"
    covered = set()
    for server in doc["servers"]:  # type: ignore[attr-defined]
        if server["blocks"]:
            covered.update(range(*server["blocks"]))
    assert covered == set(range(40))


def test_milp_solves_a_tiny_pipeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "model: SmolLM2-135M-Instruct\nservers:\n"
        "  - {name: a, memory_gib: 1, tau_decode_ms: 1}\n  - {name: b, memory_gib: 1, tau_decode_ms: 2}\n"
        "rtt_ms: {client: {a: 10, b: 1}}\n"
    )
    doc = _plan(["--pipeline", str(path), "--algorithm", "milp", "--time-limit", "30"], capsys)
    assert doc["status"] == "optimal"
    # One request: a single server beats two round trips whenever the whole model fits on it.
    assert len(doc["chains"][0]["hops"]) == 1  # type: ignore[index]


def test_table_output_names_servers_and_times(pipeline: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "opentela", "plan", "--pipeline", str(pipeline)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "big" in out and "ms per token" in out and "Theorem 3.5" in out


@pytest.mark.parametrize(
    "content, rtt, message",
    [
        ("servers: []\n", None, "needs 'model'"),
        (PIPELINE.replace("gpu: A100-80G", "gpu: B999"), None, "unknown device 'B999'"),
        (PIPELINE.replace("tau_decode_ms: 2, ", ""), None, "give a gpu"),
        (PIPELINE, "near: {big: 2, half-1: 1, half-2: 1}\n", "no RTTs for client 'far'"),
        (
            PIPELINE,
            "near: {big: 2, half-1: 1, half-2: 1}\nfar: {big: 1, half-1: 1}\n",
            "no RTT from client 'far' to server(s) half-2",
        ),
        (PIPELINE, "near: [1, 2]\n", "must map each client"),
        (PIPELINE.replace("requests: 2", "requests: 100000"), None, "no placement covers"),
    ],
)
def test_bad_input_gets_a_clear_error(
    content: str, rtt: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(content)
    argv = ["plan", "--pipeline", str(path)]
    if rtt is not None:
        (tmp_path / "rtt.yaml").write_text(rtt)
        argv += ["--rtt", str(tmp_path / "rtt.yaml")]
    assert main(argv) in (1, 2)
    captured = capsys.readouterr()
    assert message in captured.err + captured.out


def test_plan_without_inputs_explains_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "--pipeline FILE" in capsys.readouterr().err


def test_catalog_models_give_the_papers_block_and_cache_sizes() -> None:
    from opentela.scheduler.bprr.catalog import block_model, server_from_device
    from opentela.scheduler.hardware import load_catalog
    from opentela.scheduler.models import load_model

    spec = load_model("Llama-2-13b")
    model = block_model(spec, input_len=20, output_len=128)
    assert model.n_blocks == 40
    assert model.block_bytes == 2 * (4 * 5120**2 + 3 * 5120 * 13824 + 2 * 5120)  # fp16 weights of one block
    assert model.cache_bytes == 2 * 5120 * (20 + 128) * 2  # s_c = 2 d_model (l^I + l) dtype_bytes
    gqa = block_model(load_model("Llama-3.1-8B"))
    assert gqa.cache_bytes_per_token == 2 * 8 * 128 * 2  # grouped-query attention keeps 8 KV heads
    a100 = server_from_device("a", load_catalog()["A100-80G"], spec, model, mem_util=0.9)
    h100 = server_from_device("h", load_catalog()["H100-SXM"], spec, model, mem_util=0.9)
    assert a100.memory_bytes == int(80 * 1024**3 * 0.9)
    assert 0 < h100.tau_decode_s < a100.tau_decode_s < a100.tau_prefill_s
