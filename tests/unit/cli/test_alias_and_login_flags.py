"""The ingress's alias and default-model flags and the frontend's login flags: a flag beats its OTELA_* variable,
which beats the configuration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from opentela.cli import frontend, start
from opentela.cli.main import build_parser
from opentela.cli.slurm import start_argv
from opentela.config import OtelaConfig, load_config
from opentela.errors import ConfigError


def _config(argv: list[str], env: dict[str, str], file: Path) -> OtelaConfig:
    args = build_parser(only=(argv[0],)).parse_args(argv)
    flags = (start if argv[0] == "start" else frontend).config_flags(args)
    return load_config(file, env=env, flags=flags)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "otela.toml"
    path.write_text(
        "[gateway]\n"
        'model_aliases = ["from-file=file/model"]\n'
        'default_model = "from-file"\n'
        "[frontend]\n"
        'oidc_issuer = "https://file.example"\n'
        'oidc_client_id = "file-client"\n'
        'oidc_client_secret = "file-secret"\n'
        'oidc_redirect_url = "https://file.example/auth/callback"\n'
        'oidc_allowed_domains = ["file.example"]\n'
        'oidc_allowed_groups = ["file-group"]\n'
    )
    return path


def test_alias_and_default_model_flags_beat_the_variables_and_the_file(config_file: Path) -> None:
    env = {"OTELA_GATEWAY_MODEL_ALIASES": "from-env=env/model", "OTELA_GATEWAY_DEFAULT_MODEL": "from-env"}
    plain = _config(["start"], env, config_file)
    assert (plain.gateway.model_aliases, plain.gateway.default_model) == (("from-env=env/model",), "from-env")
    assert _config(["start"], {}, config_file).gateway.model_aliases == ("from-file=file/model",)
    argv = ["start", "--model-alias", "smol=org/SmolLM2", "--model-alias", "big=org/Big"]
    argv += ["--default-model", "big"]
    flagged = _config(argv, env, config_file)
    assert flagged.gateway.model_aliases == ("smol=org/SmolLM2", "big=org/Big")
    assert flagged.gateway.default_model == "big"
    assert flagged.gateway.model_names().resolve("smol") == "org/SmolLM2"
    # A malformed alias is refused before anything starts.
    with pytest.raises(ConfigError, match="ALIAS=MODEL_ID"):
        _config(["start", "--model-alias", "smol"], {}, config_file).gateway.model_names()


@pytest.mark.parametrize("command", ["frontend", "start"])
def test_login_flags_beat_the_variables_and_the_file(command: str, config_file: Path, tmp_path: Path) -> None:
    env = {
        "OTELA_FRONTEND_OIDC_ISSUER": "https://env.example",
        "OTELA_FRONTEND_OIDC_CLIENT_ID": "env-client",
        "OTELA_FRONTEND_OIDC_CLIENT_SECRET": "env-secret",
        "OTELA_FRONTEND_OIDC_REDIRECT_URL": "https://env.example/auth/callback",
        "OTELA_FRONTEND_OIDC_ALLOWED_DOMAINS": "env.example,lab.env.example",
        "OTELA_FRONTEND_OIDC_ALLOWED_GROUPS": "env-group",
    }
    plain = _config([command], env, config_file).frontend
    assert (plain.oidc_issuer, plain.oidc_client_secret) == ("https://env.example", "env-secret")
    assert plain.oidc_allowed_domains == ("env.example", "lab.env.example")
    secret = tmp_path / "client-secret"
    secret.write_text("flag-secret\n")
    argv = [
        command,
        *("--oidc-issuer", "https://idp.uni.example/realms/lab"),
        *("--oidc-client-id", "otela"),
        *("--oidc-client-secret-file", str(secret)),
        *("--oidc-redirect-url", "https://otela.uni.example/auth/callback"),
        *("--oidc-allowed-domain", "uni.example", "--oidc-allowed-domain", "physics.uni.example"),
        *("--oidc-allowed-group", "physics"),
    ]
    fc = _config(argv, env, config_file).frontend
    assert (fc.oidc_issuer, fc.oidc_client_id) == ("https://idp.uni.example/realms/lab", "otela")
    assert fc.oidc_client_secret == "flag-secret"  # the file's text, without its newline
    assert fc.oidc_redirect_url == "https://otela.uni.example/auth/callback"
    assert fc.oidc_allowed_domains == ("uni.example", "physics.uni.example")
    assert fc.oidc_allowed_groups == ("physics",)
    # Flags not given leave the other settings to the variables and the file.
    only_issuer = _config([command, "--oidc-issuer", "https://flag.example"], {}, config_file).frontend
    assert (only_issuer.oidc_issuer, only_issuer.oidc_client_id) == ("https://flag.example", "file-client")
    assert only_issuer.oidc_allowed_groups == ("file-group",)


def test_the_client_secret_comes_from_a_readable_non_empty_file(tmp_path: Path) -> None:
    parser = build_parser(only=("frontend",))
    missing = parser.parse_args(["frontend", "--oidc-client-secret-file", str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="cannot read the OIDC client secret file"):
        frontend.config_flags(missing)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        frontend.config_flags(parser.parse_args(["frontend", "--oidc-client-secret-file", str(empty)]))
    # No flag takes the secret itself (it would show up in process lists): argparse reads this as the file flag,
    # and the refusal does not repeat the value.
    with pytest.raises(ConfigError) as refused:
        frontend.config_flags(parser.parse_args(["frontend", "--oidc-client-secret", "s3cret"]))
    assert "s3cret" not in str(refused.value)


def test_slurm_passes_the_new_start_flags_on(tmp_path: Path) -> None:
    argv = ["slurm", "--model-alias", "smol=org/SmolLM2", "--default-model", "smol"]
    args = build_parser(only=("slurm",)).parse_args([*argv, "--oidc-allowed-group", "lab"])
    assert start_argv(args, args.start_flags) == [
        *("--oidc-allowed-group", "lab"),
        *("--model-alias", "smol=org/SmolLM2"),
        *("--default-model", "smol"),
    ]


@pytest.mark.parametrize(("command", "section"), [("start", "gateway"), ("frontend", "frontend")])
def test_cors_origin_flags_beat_the_variables_and_the_file(
    command: str, section: str, tmp_path: Path
) -> None:
    file = tmp_path / "otela.yaml"
    file.write_text(f"{section}:\n  cors_origins: [https://file.example]\n")
    env = {f"OTELA_{section.upper()}_CORS_ORIGINS": "https://env.example, http://localhost:5173"}

    def origins(argv: list[str], env: dict[str, str]) -> tuple[str, ...]:
        return getattr(_config([command, *argv], env, file), section).cors_origins

    assert origins([], {}) == ("https://file.example",)
    assert origins([], env) == ("https://env.example", "http://localhost:5173")
    argv = ["--cors-origin", "https://a.example", "--cors-origin", "https://b.example:8443"]
    assert origins(argv, env) == ("https://a.example", "https://b.example:8443")
    with pytest.raises(ConfigError, match=rf"{section}.cors_origins.*'https://a.example/'"):
        origins(["--cors-origin", "https://a.example/"], {})
