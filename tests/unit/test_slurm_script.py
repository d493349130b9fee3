"""`otela slurm`: the batch script it writes says what the flags said, is valid bash, and checks its input."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from opentela.cli.main import build_parser, main
from opentela.cli.slurm import SlurmJob, current_otela, render_script, time_limit_seconds
from opentela.errors import ConfigError


def write(tmp_path: Path, *flags: str) -> str:
    script = tmp_path / "job.sbatch"
    assert main(["slurm", "--output", str(script), *flags]) == 0
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)  # the script parses
    return text


def assignment(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"{name}=("))
    return shlex.split(line[len(name) + 2 : -1])


def test_script_carries_start_flags_engine_and_job_options(tmp_path: Path) -> None:
    text = write(
        tmp_path,
        "--bootstrap",
        "12D3KooWx@10.0.0.1:4001",
        "--bootstrap",
        "10.0.0.2:4001",
        "--provider-id",
        "lab a",
        "--log-sink",
        "https://logs.example/otela",
        "--gpus",
        "2",
        "--time",
        "11:30:00",
        "--partition",
        "gpu",
        "--job-name",
        "qwen",
        "--sbatch-option=--account=proj",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3-1.7B",
        "--tensor-parallel-size",
        "2",
    )
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "--job-name=qwen",
        "--nodes=1",
        "--ntasks=1",
        "--time=11:30:00",
        f"--output={tmp_path}/qwen-%j.out",
        "--gres=gpu:2",
        "--partition=gpu",
        "--account=proj",
    ]
    assert assignment(text, "START") == [
        "start",
        "--bootstrap",
        "12D3KooWx@10.0.0.1:4001",
        "--bootstrap",
        "10.0.0.2:4001",
        "--provider-id",
        "lab a",
        "--log-sink",
        "https://logs.example/otela",
    ]
    assert assignment(text, "ENGINE") == ["vllm", "serve", "Qwen/Qwen3-1.7B", "--tensor-parallel-size", "2"]
    assert assignment(text, "OTELA") == current_otela()
    assert f"SCRIPT={tmp_path / 'job.sbatch'}" in text.splitlines()
    assert "trap renew" not in text and "--signal" not in text


def test_switches_log_flags_and_the_config_path_are_passed_on(tmp_path: Path) -> None:
    text = write(
        tmp_path,
        "--ingress",
        "--frontend",
        "--log-level",
        "DEBUG",
        "--log-format",
        "json",
        "--config",
        "node.toml",
    )
    start = assignment(text, "START")
    assert start[:4] == ["start", "--config", str(Path("node.toml").absolute()), "--ingress"]
    assert start[4:] == ["--frontend", "--log-level", "DEBUG", "--log-format", "json"]


def test_zero_gpus_and_renewal_and_requeue(tmp_path: Path) -> None:
    text = write(
        tmp_path, "--gpus", "0", "--renew", "--renew-before", "5", "--requeue", "--otela-cmd", "/opt/x/otela"
    )
    assert "--gres" not in text
    assert "#SBATCH --signal=B:USR1@300" in text
    assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text
    assert "trap renew USR1" in text and 'sbatch --parsable "$SCRIPT"' in text
    assert assignment(text, "OTELA") == ["/opt/x/otela"]
    assert assignment(text, "ENGINE") == []


def test_without_submit_the_script_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = write(tmp_path, "--engine", "simulated")
    out, err = capsys.readouterr()
    assert out == text
    assert f"wrote {tmp_path / 'job.sbatch'}" in err and "sbatch" in err
    assert assignment(text, "START") == ["start", "--engine", "simulated"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),
        ("5:30", 330),
        ("12:00:00", 43200),
        ("1-0", 86400),
        ("2-03:04", 183840),
        ("0-00:00:07", 7),
    ],
)
def test_slurm_time_formats(text: str, seconds: int) -> None:
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "12h", "1:2:3:4", "-5", "00:00:00"])
def test_bad_time_limits_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="time limit"):
        time_limit_seconds(text)


def test_renewal_must_come_before_the_time_limit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="renew-before"):
        SlurmJob(tmp_path / "j", ("otela",), (), (), time_limit="30", renew_before_s=1800)


def test_bad_input_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "--output", str(tmp_path / "j"), "--time", "soon"]) == 2
    assert "--time 'soon'" in capsys.readouterr().err
    assert main(["slurm", "--output", str(tmp_path / "j"), "--job-name", "a b"]) == 2
    assert main(["slurm", "--output", str(tmp_path / "j"), "--gpus", "-1"]) == 2
    assert main(["slurm", "--output", str(tmp_path / "j"), "--renew", "--renew-before", "-5"]) == 2
    assert "--renew-before -5" in capsys.readouterr().err


def test_submit_without_sbatch_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["slurm", "--output", str(tmp_path / "j"), "--submit"]) == 2
    assert "sbatch not found" in capsys.readouterr().err


def test_every_start_flag_is_accepted_by_slurm() -> None:
    """`otela slurm` takes the same node flags as `otela start`, so a job can say anything a shell can."""
    parser = build_parser()
    start = parser.parse_args(["start", "--bootstrap", "a:1", "--health-interval", "3"])
    slurm = parser.parse_args(["slurm", "--bootstrap", "a:1", "--health-interval", "3"])
    assert start.bootstrap == slurm.bootstrap and start.health_interval == slurm.health_interval


def test_render_is_deterministic_apart_from_the_stamp(tmp_path: Path) -> None:
    job = SlurmJob(tmp_path / "j.sbatch", (sys.executable, "-m", "opentela"), ("--engine", "simulated"), ())
    a, b = render_script(job).splitlines(), render_script(job).splitlines()
    assert a[2:] == b[2:]


def test_each_job_gets_its_own_key_unless_one_is_given(tmp_path: Path) -> None:
    text = write(tmp_path, "--gpus", "0")
    assert 'START+=(--key-file "$KEY_FILE")' in text and "${SLURM_JOB_ID" in text
    given = write(tmp_path, "--gpus", "0", "--key-file", "/keys/a.key")
    assert "KEY_FILE" not in given
    assert assignment(given, "START") == ["start", "--key-file", "/keys/a.key"]


def test_a_fixed_key_with_renewal_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "--output", str(tmp_path / "j"), "--renew", "--key-file", "/keys/a.key"]) == 2
    assert "same peer id" in capsys.readouterr().err
