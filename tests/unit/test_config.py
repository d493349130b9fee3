"""Configuration precedence (flags > environment > file > defaults), validation, and the reference page."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.config import OtelaConfig, env_name, load_config, reference_markdown
from opentela.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_without_sources() -> None:
    config = load_config(None, env={})
    assert config == OtelaConfig()
    assert config.gateway.policy == "random"


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    toml = tmp_path / "otela.toml"
    toml.write_text(
        '[gateway]\nmax_retries = 5\npolicy = "random"\n[node]\nprovider_id = "file"\nbootstrap = ["a:1"]\n'
    )
    env = {env_name("gateway", "max_retries"): "7", env_name("node", "provider_id"): "env"}
    config = load_config(toml, env=env, flags={"node": {"provider_id": "flag"}})
    assert config.node.provider_id == "flag"
    assert config.gateway.max_retries == 7
    assert config.node.bootstrap == ("a:1",)


def test_yaml_file_and_list_from_env(tmp_path: Path) -> None:
    yml = tmp_path / "otela.yaml"
    yml.write_text("node:\n  role: ingress\n  ready_timeout: 12\n")
    config = load_config(yml, env={"OTELA_NODE_BOOTSTRAP": "h1:1, h2:2"})
    assert config.node.role == "ingress"
    assert config.node.ready_timeout == 12.0
    assert config.node.bootstrap == ("h1:1", "h2:2")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[gateway]\nmax_retries = 'many'\n", "max_retries"),
        ("[gateway]\nno_such = 1\n", "no_such"),
        ("[x", "TOML"),
    ],
)
def test_bad_file_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, env={})


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="OTELA_GATEWAY_MAX_BODY_BYTES"):
        load_config(None, env={"OTELA_GATEWAY_MAX_BODY_BYTES": "lots"})


def test_reference_page_is_current() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == reference_markdown(), "regenerate with: otela config reference > docs/configuration.md"
