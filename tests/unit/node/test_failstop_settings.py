"""Fail-stop settings: read from variables like every setting, and refused early when they cannot work."""

from __future__ import annotations

import pytest

from opentela.config import load_config
from opentela.errors import ConfigError
from opentela.node._config import DEFAULT_FATAL_LOG_PATTERNS


def test_defaults_watch_health_and_the_log_and_ship_nowhere() -> None:
    node = load_config(env={}).node
    assert node.fatal_log_patterns == DEFAULT_FATAL_LOG_PATTERNS
    assert node.health_interval > 0 and node.health_failures > 0 and node.unhealthy_limit > 0
    assert node.log_sink == ""


def test_variables_set_patterns_sink_and_limits() -> None:
    node = load_config(
        env={
            "OTELA_NODE_FATAL_LOG_PATTERNS": r"Xid \d+, segfault",
            "OTELA_NODE_LOG_SINK": "https://logs.example/otela",
            "OTELA_NODE_UNHEALTHY_LIMIT": "30",
            "OTELA_NODE_HEALTH_FAILURES": "0",
        }
    ).node
    assert node.fatal_log_patterns == (r"Xid \d+", "segfault")
    assert node.log_sink == "https://logs.example/otela"
    assert node.unhealthy_limit == 30.0 and node.health_failures == 0


def test_an_empty_pattern_list_turns_log_watching_off() -> None:
    assert load_config(env={"OTELA_NODE_FATAL_LOG_PATTERNS": ""}).node.fatal_log_patterns == ()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OTELA_NODE_FATAL_LOG_PATTERNS", "(unclosed", "not a valid regular expression"),
        ("OTELA_NODE_LOG_SINK", "s3://bucket/x", "use a file path"),
        ("OTELA_NODE_HEALTH_FAILURES", "-1", "health_failures must be >= 0"),
        ("OTELA_NODE_HEALTH_TIMEOUT", "0", "health_timeout must be positive"),
        ("OTELA_NODE_LOG_SINK_TIMEOUT", "-2", "log_sink_timeout must be positive"),
    ],
)
def test_unusable_values_are_configuration_errors(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={name: value})
