"""Log settings: read with the configuration, checked once, applied by setup_logging."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from opentela._logging import LogConfig, setup_logging
from opentela.config import load_config
from opentela.errors import ConfigError


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_settings_come_from_the_environment_and_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_config(None, env={}).log == LogConfig()
    assert load_config(None, env={"OTELA_LOG_LEVEL": "debug"}).log.level == "debug"
    file = tmp_path / "otela.toml"
    file.write_text('[log]\nformat = "json"\n')
    assert load_config(file, env={}).log.format == "json"


@pytest.mark.parametrize("settings", [{"level": "LOUD"}, {"format": "xml"}])
def test_bad_settings_are_config_errors(settings: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        LogConfig(**settings)
    env = {f"OTELA_LOG_{k.upper()}": v for k, v in settings.items()}
    with pytest.raises(ConfigError):
        load_config(None, env=env)


def test_setup_installs_one_handler_with_the_level_and_format(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(LogConfig(level="debug", format="json"))
    assert root_logger.level == logging.DEBUG and len(root_logger.handlers) == 1
    logging.getLogger("opentela.test").debug("hello", extra={"peer": "p1"})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (line["level"], line["logger"], line["msg"], line["peer"]) == (
        "DEBUG",
        "opentela.test",
        "hello",
        "p1",
    )
