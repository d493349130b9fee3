"""The engine registry: every built-in adapter is registered under its own name, once."""

from __future__ import annotations

import pytest

from opentela.engines._registry import ENGINES, engine_adapter
from opentela.engines.base import Engine
from opentela.errors import PluginError


def test_every_builtin_engine_is_registered() -> None:
    assert {"embedded", "simulated", "vllm", "sglang", "llamacpp", "custom"} <= set(ENGINES.names())


def test_builtin_engine_names_match_their_adapters() -> None:
    for name in ENGINES.names():
        adapter = engine_adapter(name)
        assert isinstance(adapter, Engine) and adapter.name == name
    with pytest.raises(PluginError, match="already registered"):
        ENGINES.register("vllm")(type("Other", (Engine,), {}))


def test_unknown_engine_lists_the_known_ones() -> None:
    with pytest.raises(PluginError, match=r"unknown engine 'nope'; known: .*vllm"):
        engine_adapter("nope")
