"""FabricConfig defaults, help text and validation."""

from __future__ import annotations

import dataclasses

import pytest

from opentela.errors import ConfigError
from opentela.fabric._config import FabricConfig


def test_defaults_and_help() -> None:
    config = FabricConfig()
    assert (config.dial_timeout, config.handshake_timeout) == (5.0, 5.0)
    assert (config.keepalive_interval, config.keepalive_timeout) == (15.0, 10.0)
    assert config.stream_window == 256 * 1024
    assert all(f.metadata.get("help") for f in dataclasses.fields(FabricConfig))


@pytest.mark.parametrize(
    "kw",
    [
        {"dial_timeout": 0},
        {"keepalive_timeout": -1},
        {"stream_window": 1024},
        {"max_frame_payload": 10},
        {"max_frame_payload": 10**7},
        {"max_inbound_streams": 0},
    ],
)
def test_invalid_values_are_config_errors(kw: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(kw))):
        FabricConfig(**kw)
