"""`otela plan --failover MODEL`: the configurations per GPU count and a recovery plan, as a user prints them."""

from __future__ import annotations

import json

import pytest

from opentela.cli.main import main


def test_the_table_and_the_recovery_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--failover", "Mixtral-8x22B-v0.1", "--lost", "0", "--inflight", "8x4096", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    used = {(r["available"], r["mode"]): r["gpus_used"] if r["fits"] else None for r in doc["layouts"]}
    assert [used[(n, "standard")] for n in range(1, 9)] == [None] * 7 + [8]
    assert [used[(n, "raidserve")] for n in range(1, 9)] == [None] * 4 + [5, 6, 7, 8]
    rec = doc["recovery"]
    assert rec["survivors"] == [1, 2, 3, 4, 5, 6, 7] and rec["replicated_kv_heads_after"] == [0]
    assert rec["times_s"]["full"] < rec["times_s"]["host"] < rec["times_s"]["recompute"]
    assert main(["plan", "--failover", "Llama-3.1-70B-Instruct", "--gpus", "4"]) == 0
    assert "raidserve" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--inflight", "many"], "--inflight must be NxTOKENS"),
        (["--lost", "9"], "--lost must be a GPU index"),
        (["--device", "Abacus"], "unknown device"),
        (["--gpus", "0"], "--gpus must be between"),
    ],
)
def test_bad_flags_say_what_is_wrong(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--failover", "Llama-3.1-70B-Instruct", "--lost", "1", *extra]) != 0
    assert message in capsys.readouterr().err
