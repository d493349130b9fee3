"""Model aliases, retired names and the default model at the ingress: configuration, resolution, close-name hints,
and requests, listings and 404s through a gateway."""

from __future__ import annotations

import json

import pytest
from meshkit import MODEL, chat, gateway_kit
from openai import AsyncOpenAI

from opentela.config import load_config
from opentela.errors import ConfigError, ModelNotFoundError
from opentela.gateway._config import GatewayConfig
from opentela.gateway.model_names import ModelNames, unknown_model_error

SERVED = "meta-llama/Llama-3.3-70B-Instruct"


def test_configuration_from_a_file_variables_and_entries(tmp_path) -> None:
    path = tmp_path / "otela.toml"
    path.write_text(
        "[gateway]\n"
        f'model_aliases = ["llama-3.3-70b={SERVED}"]\n'
        'retired_models = ["llama-2-70b=llama-3.3-70b|retired in June"]\n'
        'default_model = "llama-3.3-70b"\n'
    )
    names = load_config(path, env={}).gateway.model_names()
    assert names.aliases == {"llama-3.3-70b": SERVED} and names.default == "llama-3.3-70b"
    assert names.resolve(None) == SERVED and names.resolve("") == SERVED and names.resolve("other") == "other"
    # Variables override the file, one entry per comma.
    env = {"OTELA_GATEWAY_MODEL_ALIASES": f"a={SERVED},b=other/model", "OTELA_GATEWAY_DEFAULT_MODEL": ""}
    names = load_config(path, env=env).gateway.model_names()
    assert names.aliases == {"a": SERVED, "b": "other/model"} and names.resolve(None) is None


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_aliases": ("nonsense",)}, "ALIAS=MODEL_ID"),
        ({"model_aliases": ("a=",)}, "ALIAS=MODEL_ID"),
        ({"model_aliases": ("a=a",)}, "points at itself"),
        ({"model_aliases": ("a=x", "a=y")}, "given twice"),
        ({"model_aliases": ("a=b", "b=x")}, "not at other names"),
        ({"model_aliases": ("a=x",), "retired_models": ("a",)}, "both aliased and retired"),
        ({"model_aliases": ("a=old",), "retired_models": ("old=new",)}, "not at other names"),
        ({"retired_models": ("=x",)}, "NAME[=REPLACEMENT]"),
        ({"retired_models": ("old",), "default_model": "old"}, "default model 'old' is retired"),
    ],
)
def test_bad_tables_stop_the_node_at_start(config: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[")):
        GatewayConfig(**config)


def test_retired_names_and_close_names_in_errors() -> None:
    names = ModelNames.from_entries(
        [f"llama-3.3-70b={SERVED}"], ["llama-2-70b=llama-3.3-70b|retired in June", "gone"]
    )
    with pytest.raises(ModelNotFoundError) as caught:
        names.resolve("llama-2-70b")
    err = caught.value.to_openai()["error"]
    assert (err["code"], err["type"], err["param"]) == ("model_not_found", "invalid_request_error", "model")
    assert (
        err["message"]
        == "model 'llama-2-70b' has been retired; use 'llama-3.3-70b' instead (retired in June)"
    )
    assert names.unknown("gone", [SERVED]).message == "model 'gone' has been retired"
    typo = names.unknown("llama-3.3-70", [SERVED, "Qwen/Qwen3-1.7B"])
    assert typo.status_code == 404
    assert (
        "did you mean 'llama-3.3-70b'?" in typo.message
        and "available models: Qwen/Qwen3-1.7B, " in typo.message
    )
    # Case and punctuation are forgiven when nothing is close as typed.
    assert "'Qwen/Qwen3-1.7B'" in unknown_model_error("qwen3 1.7b", ["Qwen/Qwen3-1.7B"]).message
    far = unknown_model_error("zzz", ["Qwen/Qwen3-1.7B"], ["Qwen/Qwen3-1.7B"]).message
    assert "did you mean" not in far and far.endswith("available models: Qwen/Qwen3-1.7B")
    many = unknown_model_error("x", [], [f"m{i:02}" for i in range(25)]).message
    assert many.endswith("m19 and 5 more") and unknown_model_error("x", []).message.endswith(
        "none are being served"
    )


async def test_aliases_route_list_and_retrieve_through_the_gateway() -> None:
    async with gateway_kit(
        model_aliases=(f"short={MODEL}", "dangling=nobody/serves-this"),
        retired_models=(f"old-sim=short|replaced by {MODEL}",),
        default_model="short",
    ) as kit:
        await kit.replica("a")
        # An alias and a request with no model at all both go to the served id, which the answer names.
        for body in (chat(model="short"), {k: v for k, v in chat().items() if k != "model"}):
            status, headers, answer = await kit.post(body)
            assert status == 200, answer
            assert headers["X-Otela-Model"] == MODEL and json.loads(answer)["model"] == MODEL
        assert kit.requests_seen("a") == 2
        assert kit.http is not None
        async with kit.http.get(kit.url + "/v1/models") as resp:
            listing = (await resp.json())["data"]
        by_id = {m["id"]: m for m in listing}
        assert set(by_id) == {MODEL, "short"}  # an alias whose target nobody serves is not offered
        assert by_id["short"]["alias_for"] == MODEL and by_id["short"]["default"] is True
        assert by_id["short"]["replicas"] == by_id[MODEL]["replicas"] and "alias_for" not in by_id[MODEL]
        async with kit.http.get(kit.url + "/v1/models/short") as resp:
            assert resp.status == 200 and (await resp.json())["alias_for"] == MODEL
        async with kit.http.get(kit.url + "/v1/dnt/names") as resp:
            table = await resp.json()
        assert table["default_model"] == "short" and table["aliases"]["short"] == MODEL
        assert table["retired"] == [
            {"id": "old-sim", "replacement": "short", "message": f"replaced by {MODEL}"}
        ]
        # Retired and unknown names: 404 in OpenAI's shape, naming the replacement or the close names.
        status, _, answer = await kit.post(chat(model="old-sim"))
        err = json.loads(answer)["error"]
        assert status == 404 and err["code"] == "model_not_found" and "use 'short' instead" in err["message"]
        status, _, answer = await kit.post(chat(model="sim-modle"))
        assert status == 404 and "did you mean 'sim-model'" in json.loads(answer)["error"]["message"]
        async with kit.http.get(kit.url + "/v1/models/old-sim") as resp:
            assert resp.status == 404 and "retired" in (await resp.json())["error"]["message"]
        assert kit.requests_seen("a") == 2


async def test_model_ids_with_slashes_are_retrieved_whole() -> None:
    async with gateway_kit() as kit:
        await kit.replica("a", model=SERVED)
        client = AsyncOpenAI(base_url=kit.url + "/v1", api_key="unused", max_retries=0)
        found = await client.models.retrieve(SERVED)  # the SDK sends the slash escaped
        await client.close()
        assert found.id == SERVED and found.object == "model"
        assert found.model_extra["replicas"][0]["session_id"] == "s-a"
        assert kit.http is not None
        async with kit.http.get(kit.url + "/v1/models/meta-llama/Llama-3.3-70B") as resp:
            body = await resp.json()
        assert resp.status == 404
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert f"did you mean '{SERVED}'" in body["error"]["message"]
