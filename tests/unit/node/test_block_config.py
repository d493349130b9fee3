"""`[node] blocks` and the split-model settings of the gateway: parsed as documented, refused with a reason."""

from __future__ import annotations

import pytest

from opentela.errors import ConfigError
from opentela.gateway._config import GatewayConfig
from opentela.node._config import NodeConfig


def test_blocks_parse_as_a_half_open_range() -> None:
    assert NodeConfig(blocks="SmolLM2-135M-Instruct:0-10").block_range() == ("SmolLM2-135M-Instruct", 0, 10)
    assert NodeConfig(blocks="org/model:v2:10-20").block_range() == ("org/model:v2", 10, 20)
    assert NodeConfig().blocks == ""


@pytest.mark.parametrize(
    "bad", ["model", "model:10", "model:10-", ":0-10", "model:a-b", "model:10-10", "model:20-10"]
)
def test_malformed_blocks_are_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(ConfigError, match="blocks"):
        NodeConfig(blocks=bad)


def test_block_server_limits() -> None:
    with pytest.raises(ConfigError):
        NodeConfig(blocks_cache_mib=0)
    with pytest.raises(ConfigError):
        NodeConfig(blocks_session_ttl=0)


def test_gateway_split_settings() -> None:
    cfg = GatewayConfig(split_model_files=("m=/models/m.gguf", "org/x = /y.gguf"))
    assert cfg.split_files() == {"m": "/models/m.gguf", "org/x": "/y.gguf"}
    for bad in (
        {"split_model_files": ("nopath",)},
        {"split_forwarding": "both"},
        {"split_routing": "fastest"},
        {"split_step_timeout": 0},
        {"split_max_failovers": -1},
    ):
        with pytest.raises(ConfigError):
            GatewayConfig(**bad)  # type: ignore[arg-type]
