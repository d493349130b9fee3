"""The plugin registry: decorator registration, duplicates raise, lowercase lookup, import paths."""

from __future__ import annotations

import pytest

from opentela.engines._registry import ENGINES, Registry, engine_adapter
from opentela.engines.base import Engine
from opentela.errors import ConfigError


class Thing:
    name = "Alpha"


def test_register_and_look_up_case_insensitively() -> None:
    reg: Registry[type[Thing]] = Registry("thing")
    reg.register()(Thing)
    assert reg.get("alpha") is Thing and reg.get("ALPHA ") is Thing
    assert "Alpha" in reg and reg.names() == ["alpha"] and len(reg) == 1

    @reg.register("beta")
    class Beta(Thing):
        pass

    assert reg.get("Beta") is Beta and list(reg) == ["alpha", "beta"]


def test_duplicate_name_raises() -> None:
    reg: Registry[object] = Registry("thing")
    reg.add("one", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.add("ONE", 2)
    assert reg.get("one") == 1
    with pytest.raises(ValueError, match="non-empty name"):
        reg.add(" ", 3)


def test_unknown_name_lists_known_ones() -> None:
    reg: Registry[object] = Registry("policy")
    reg.add("random", 1)
    with pytest.raises(ConfigError, match="unknown policy 'nope'; known: random"):
        reg.get("nope")


def test_import_path_loads_an_operator_plugin() -> None:
    reg: Registry[object] = Registry("thing")
    assert reg.get("opentela.engines.base:Engine") is Engine
    with pytest.raises(ConfigError, match="cannot load"):
        reg.get("opentela.engines.base:Missing")


def test_builtins_load_on_first_lookup() -> None:
    reg: Registry[object] = Registry("thing", builtins=("opentela.engines.vllm",))
    assert reg.names() == []  # the vllm module registers into ENGINES, not here, and loads once
    assert {"embedded", "simulated", "vllm", "sglang", "llamacpp", "custom"} <= set(ENGINES.names())


def test_builtin_engine_names_match_their_adapters() -> None:
    for name in ENGINES.names():
        adapter = engine_adapter(name)
        assert isinstance(adapter, Engine) and adapter.name == name
    with pytest.raises(ValueError, match="already registered"):
        ENGINES.register("vllm")(type("Other", (Engine,), {}))
