"""Timeout classes: parsing, which model gets which class, and the forwarder applying the routed model's class
against slow simulated engines behind the real proxy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from meshkit import chat, gateway_kit, record

from opentela.config import load_config
from opentela.engines.simulated import SimulatedConfig
from opentela.errors import ConfigError
from opentela.gateway._config import GatewayConfig
from opentela.gateway.timeout_classes import (
    REASONING_FIRST_BYTE_S,
    REASONING_TOTAL_S,
    TimeoutClass,
    TimeoutClasses,
)

SLOW_MS = 800.0
"""Engine time to first token: past the tests' default first-byte timeout, well within their reasoning one."""


def test_default_class_is_the_gateway_timeouts_and_reasoning_is_built_in() -> None:
    config = GatewayConfig()
    classes = TimeoutClasses.from_config(config)
    assert classes.default == TimeoutClass(
        "default", config.first_byte_timeout, config.idle_timeout, config.total_timeout, config.max_retries
    )
    reasoning = classes.classes["reasoning"]
    assert (reasoning.first_byte_timeout, reasoning.total_timeout) == (
        REASONING_FIRST_BYTE_S,
        REASONING_TOTAL_S,
    )
    assert reasoning.first_byte_timeout > config.first_byte_timeout and reasoning.max_retries == 1


def test_entries_change_a_class_or_add_one_inheriting_the_rest() -> None:
    config = GatewayConfig(
        max_retries=3,
        timeout_classes=("reasoning: first_byte_timeout=60", "Batch: total_timeout=7200 max_retries=0"),
        model_classes=("batch-*=batch",),
    )
    classes = TimeoutClasses.from_config(config).classes
    assert classes["reasoning"].first_byte_timeout == 60
    assert classes["reasoning"].total_timeout == REASONING_TOTAL_S  # unnamed keys keep the built-in values
    assert classes["batch"] == TimeoutClass(
        "batch", config.first_byte_timeout, config.idle_timeout, 7200.0, 0
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"timeout_classes": ("reasoning first_byte_timeout=5",)}, "NAME: KEY=VALUE"),
        ({"timeout_classes": ("slow: first_byte=5",)}, "KEY one of first_byte_timeout"),
        ({"timeout_classes": ("slow: total_timeout=soon",)}, "must be a number"),
        ({"timeout_classes": ("slow: total_timeout=0",)}, "must be positive"),
        ({"timeout_classes": ("default: total_timeout=5",)}, "set those instead"),
        ({"model_classes": ("*-slow=slow",)}, "unknown timeout class 'slow'"),
        ({"model_classes": ("reasoning",)}, "PATTERN=CLASS"),
    ],
)
def test_bad_entries_are_config_errors(settings: dict[str, tuple[str, ...]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GatewayConfig(**settings)  # type: ignore[arg-type]


def test_a_model_gets_its_pattern_else_the_advertised_setting_else_default() -> None:
    classes = TimeoutClasses.from_config(GatewayConfig())
    plain = [record("a", model="m")]
    assert classes.for_model("DeepSeek-R1-Distill-Qwen-7B", plain).name == "reasoning"
    assert classes.for_model("deepseek-r1:14b", plain).name == "reasoning"  # patterns ignore case
    assert classes.for_model("Qwen3-Next-80B-A3B-Thinking", plain).name == "reasoning"
    assert classes.for_model("Qwen3-32B", plain).name == "default"
    for flag in (True, "true"):
        says = [record("a", model="Qwen3-32B"), record("b", model="Qwen3-32B", settings={"reasoning": flag})]
        assert classes.for_model("Qwen3-32B", says).name == "reasoning"
    denies = [record("a", model="Qwen3-32B", settings={"reasoning": False})]
    assert classes.for_model("Qwen3-32B", denies).name == "default"
    # The operator's pattern wins over what a replica advertises; the first matching pattern wins.
    config = GatewayConfig(
        timeout_classes=("fast: first_byte_timeout=5",), model_classes=("qwen3-*=fast", "*=reasoning")
    )
    ours = TimeoutClasses.from_config(config)
    assert (
        ours.for_model("Qwen3-32B", [record("b", model="Qwen3-32B", settings={"reasoning": True})]).name
        == "fast"
    )
    assert ours.for_model("llama", [record("a", model="llama")]).name == "reasoning"


def test_settings_come_from_the_environment_and_a_toml_file(tmp_path: Path) -> None:
    env = {
        "OTELA_GATEWAY_TIMEOUT_CLASSES": "reasoning: first_byte_timeout=900,batch: total_timeout=7200",
        "OTELA_GATEWAY_MODEL_CLASSES": "*R1*=reasoning,batch-*=batch",
    }
    classes = TimeoutClasses.from_config(load_config(env=env).gateway)
    assert classes.classes["reasoning"].first_byte_timeout == 900
    assert classes.for_model("batch-7b", []).name == "batch"
    toml = tmp_path / "otela.toml"
    toml.write_text(
        "[gateway]\n"
        'timeout_classes = ["reasoning: first_byte_timeout=1200 max_retries=0"]\n'
        'model_classes = ["*Thinking*=reasoning"]\n'
    )
    gateway = load_config(toml, env={}).gateway
    reasoning = TimeoutClasses.from_config(gateway).classes["reasoning"]
    assert (reasoning.first_byte_timeout, reasoning.max_retries) == (1200, 0)
    assert gateway.model_classes == ("*Thinking*=reasoning",)


def slow(model: str, **kw: object) -> SimulatedConfig:
    return SimulatedConfig(model=model, ttft_ms=SLOW_MS, itl_ms=0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_slow_reasoning_model_answers_where_a_default_one_times_out(stream: bool) -> None:
    async with gateway_kit(
        first_byte_timeout=0.3, max_retries=0, timeout_classes=("reasoning: first_byte_timeout=10",)
    ) as kit:
        await kit.replica("r1", slow("sim-R1"), model="sim-R1")  # reasoning by the built-in `*R1*` pattern
        await kit.replica("flag", slow("sim-says"), model="sim-says", settings={"reasoning": True})
        await kit.replica("chat", slow("sim-chat"), model="sim-chat")
        for model in ("sim-R1", "sim-says"):
            status, headers, body = await kit.post(chat(model=model, stream=stream))
            assert status == 200, body
            assert headers["X-Otela-Session"] == {"sim-R1": "s-r1", "sim-says": "s-flag"}[model]
        status, headers, body = await kit.post(chat(model="sim-chat", stream=stream))
        assert status == 504
        assert headers["Content-Type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("timeout_error", "upstream_timeout")
        assert "within 0.3 s (timeout class default)" in error["message"]


async def test_the_total_deadline_follows_the_class() -> None:
    async with gateway_kit(total_timeout=0.3, timeout_classes=("reasoning: total_timeout=10",)) as kit:
        await kit.replica("r1", slow("sim-R1"), model="sim-R1")
        await kit.replica("chat", slow("sim-chat"), model="sim-chat")
        assert (await kit.post(chat(model="sim-R1")))[0] == 200
        status, _, body = await kit.post(chat(model="sim-chat"))
        assert status == 504
        assert "0.3 s deadline (timeout class default)" in json.loads(body)["error"]["message"]


async def test_the_retry_budget_follows_the_class() -> None:
    silent = {"hang_after": 0}
    async with gateway_kit(
        first_byte_timeout=0.2, max_retries=2, timeout_classes=("reasoning: first_byte_timeout=0.2",)
    ) as kit:
        for name in ("a", "b", "c"):
            await kit.replica(f"chat-{name}", slow("sim-chat", **silent), model="sim-chat")
            await kit.replica(f"r1-{name}", slow("sim-R1", **silent), model="sim-R1")
        assert (await kit.post(chat(model="sim-chat")))[0] == 504
        assert len(kit.mesh.dispatched) == 3  # the default class: two retries
        kit.mesh.dispatched.clear()
        assert (await kit.post(chat(model="sim-R1")))[0] == 504
        assert len(kit.mesh.dispatched) == 2  # the built-in reasoning class: one retry
