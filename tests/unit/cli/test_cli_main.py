"""The `otela` command table: every command listed and buildable, and the cheap commands stay cheap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from opentela.cli.main import COMMANDS, build_parser, chosen_command, main
from opentela.cli.start import config_flags
from opentela.config import load_config

HEAVY = ("aiohttp", "numpy", "fastapi", "sqlalchemy", "ortools", "cryptography", "uvicorn", "rich")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # one line per command in the help, whatever the terminal
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, env=env
    )


def test_help_lists_every_command_with_its_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "opentela", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # a long name puts its help on the next line
    for command in COMMANDS:
        assert f" {command.name} {command.help} " in text


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_each_command_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: otela {name}")


@pytest.mark.parametrize("argv", [["--help"], ["version"]])
def test_help_and_version_import_no_heavy_dependency(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "import opentela.cli.main as m\n"
        f"loaded = [n for n in {HEAVY!r} if n in sys.modules]\n"
        "assert not loaded, f'importing the command line loaded {loaded}'\n"
        "try:\n"
        f"    m.main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"loaded = [n for n in {HEAVY!r} if n in sys.modules]\n"
        "assert not loaded, f'{argv} loaded {loaded}'\n"
        "print(sorted(n for n in sys.modules if n.startswith('opentela.cli.')))\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    expected = ["opentela.cli.main", "opentela.cli.version"] if argv == ["version"] else ["opentela.cli.main"]
    assert out.stdout.strip().endswith(repr(expected))


def test_only_the_chosen_command_module_is_imported() -> None:
    code = (
        "import sys\n"
        "from opentela.cli.main import build_parser\n"
        "build_parser(only=('network',)).parse_args(['network', 'init'])\n"
        "print(sorted(n for n in sys.modules if n.startswith('opentela.cli.')))\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(["opentela.cli.main", "opentela.cli.network"])


def test_chosen_command_is_the_first_word_that_names_one() -> None:
    assert chosen_command(["start", "--ingress", "--", "vllm", "serve"]) == "start"
    assert chosen_command(["--help"]) is None
    assert chosen_command(["no-such-command"]) is None
    assert chosen_command([]) is None


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_log_settings_come_from_flags_over_the_environment() -> None:
    parser = build_parser(only=("start",))
    env = {"OTELA_LOG_LEVEL": "WARNING", "OTELA_LOG_FORMAT": "json"}
    plain = load_config(None, env=env, flags=config_flags(parser.parse_args(["start"])))
    assert (plain.log.level, plain.log.format) == ("WARNING", "json")
    args = parser.parse_args(["start", "--log-level", "DEBUG", "--log-format", "text"])
    flagged = load_config(None, env=env, flags=config_flags(args))
    assert (flagged.log.level, flagged.log.format) == ("DEBUG", "text")
    assert load_config(None, env={}).log.level == "INFO"
