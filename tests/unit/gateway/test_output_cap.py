"""Requests may not ask a model for more output than its context window holds (or the operator's cap)."""

from __future__ import annotations

import json

import pytest
from meshkit import chat, gateway_kit, record

from opentela.errors import ConfigError, InvalidRequestError
from opentela.gateway._config import GatewayConfig
from opentela.gateway.output_cap import OutputCap, requested_output


def test_the_larger_of_two_output_bounds_is_the_one_checked() -> None:
    assert requested_output({}) is None
    assert requested_output({"max_tokens": 5}) == ("max_tokens", 5)
    assert requested_output({"max_tokens": 5, "max_completion_tokens": 9}) == ("max_completion_tokens", 9)
    assert requested_output({"max_tokens": 1e12, "max_completion_tokens": 9}) == ("max_tokens", 1e12)
    assert (
        requested_output({"max_tokens": True, "max_completion_tokens": "9"}) is None
    )  # the engine's to refuse


def test_cap_is_the_largest_advertised_window_and_unknown_windows_count_as_the_fallback() -> None:
    caps = GatewayConfig(max_tokens_caps=("big=50", "org/m=v2=7")).output_caps()
    assert caps == {"big": 50, "org/m=v2": 7}  # the last `=` splits, so model names may hold one
    cap = OutputCap(fallback=1000, overrides=caps)
    small, large, unknown = (
        record("a", settings={"context_length": 2048}),
        record("b", settings={"max_model_len": 4096}),
        record("c"),
    )
    assert cap.limit("sim-model", [small, large])[0] == 4096
    assert cap.limit("sim-model", [small, unknown])[0] == 2048
    assert cap.limit("sim-model", [unknown])[0] == 1000
    assert cap.limit("big", [large])[0] == 50
    cap.check("sim-model", ("max_tokens", 4096), [small, large])
    with pytest.raises(InvalidRequestError) as err:
        cap.check("sim-model", ("max_completion_tokens", 4097), [small, large])
    assert err.value.param == "max_completion_tokens" and "4096" in str(err.value)
    with pytest.raises(InvalidRequestError):
        cap.check("sim-model", ("max_tokens", 1001), [unknown])


@pytest.mark.parametrize("bad", ["m", "m=", "=5", "m=0", "m=-3", "m=ten"])
def test_malformed_overrides_are_configuration_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="MODEL=N"):
        GatewayConfig(max_tokens_caps=(bad,))
    with pytest.raises(ConfigError, match="at least 1"):
        GatewayConfig(max_output_tokens=0)


async def test_the_ingress_refuses_what_no_replica_can_produce_and_serves_the_rest() -> None:
    async with gateway_kit(max_output_tokens=100_000) as kit:
        await kit.replica("a", settings={"context_length": 2048})
        await kit.replica("b", settings={"context_length": 4096})
        status, _, body = await kit.post(chat(max_tokens=10**12))
        error = json.loads(body)["error"]
        assert status == 400 and error["type"] == "invalid_request_error" and error["param"] == "max_tokens"
        assert "at most 4096" in error["message"]
        status, _, body = await kit.post(chat(max_tokens=1, max_completion_tokens=5000))
        assert status == 400 and json.loads(body)["error"]["param"] == "max_completion_tokens"
        status, _, _ = await kit.post(chat(max_tokens=3))
        assert status == 200
        status, _, _ = await kit.post(chat(max_tokens=4096, stream=True))
        assert status == 200
        assert kit.http is not None
        async with kit.http.get(kit.url + "/metrics") as resp:
            text = await resp.text()
        assert 'otela_errors_total{code="invalid_request",model="sim-model",node="-"} 2.0' in text
        assert sum(e.handlers.requests for e in kit.engines.values()) == 2  # refusals reached no engine


async def test_models_without_a_window_get_the_ingress_cap_and_overrides_win() -> None:
    async with gateway_kit(max_output_tokens=64, max_tokens_caps=("sim-model=8",)) as kit:
        await kit.replica("a", settings={"context_length": 4096})
        assert (await kit.post(chat(max_tokens=9)))[0] == 400
        assert (await kit.post(chat(max_tokens=8)))[0] == 200
    async with gateway_kit(max_output_tokens=64) as kit:
        await kit.replica("a")
        assert (await kit.post(chat(max_tokens=65)))[0] == 400
        assert (await kit.post(chat(max_tokens=64)))[0] == 200
