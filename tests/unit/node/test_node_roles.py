"""Role and reachability are enums checked when the configuration loads, spelled as in files and flags."""

from __future__ import annotations

import pytest

from opentela.config import load_config
from opentela.errors import ConfigError
from opentela.node._config import NodeConfig, Reachability, Role


def test_plain_strings_become_members_and_keep_their_spelling() -> None:
    node = NodeConfig(role="ingress", reachability="private")  # type: ignore[arg-type]
    assert node.role is Role.INGRESS and node.reachability is Reachability.PRIVATE
    assert node.role == "ingress" and str(node.reachability) == "private"
    assert NodeConfig().role is Role.WORKER and NodeConfig().reachability is Reachability.AUTO


def test_environment_and_flags_are_checked_at_load_time() -> None:
    config = load_config(env={"OTELA_NODE_REACHABILITY": "public"}, flags={"node": {"role": "ingress"}})
    assert config.node.reachability is Reachability.PUBLIC and config.node.role is Role.INGRESS
    with pytest.raises(
        ConfigError, match=r"reachability must be one of `public`, `private`, `auto`, not 'nat'"
    ):
        load_config(env={"OTELA_NODE_REACHABILITY": "nat"})
    with pytest.raises(ConfigError, match=r"role must be one of `worker`, `ingress`, `controller`"):
        load_config(env={}, flags={"node": {"role": "boss"}})
