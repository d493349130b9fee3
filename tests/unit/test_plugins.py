"""The generic plugin registry: decorator registration, duplicates raise, lowercase lookup, import paths."""

from __future__ import annotations

import pytest

from opentela.engines.base import Engine
from opentela.errors import ConfigError, PluginError
from opentela.plugins import Registry


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
    with pytest.raises(PluginError, match="already registered"):
        reg.add("ONE", 2)
    assert reg.get("one") == 1
    with pytest.raises(PluginError, match="non-empty name"):
        reg.add(" ", 3)


def test_unknown_name_lists_known_ones() -> None:
    reg: Registry[object] = Registry("policy")
    reg.add("random", 1)
    with pytest.raises(PluginError, match="unknown policy 'nope'; known: random"):
        reg.get("nope")
    assert issubclass(PluginError, ConfigError)  # a bad plugin name is a configuration mistake


def test_import_path_loads_an_operator_plugin() -> None:
    reg: Registry[object] = Registry("thing")
    assert reg.get("opentela.engines.base:Engine") is Engine
    for bad in ("opentela.engines.base:Missing", "no.such.module:Thing", ":Thing"):
        with pytest.raises(PluginError, match="cannot load thing"):
            reg.get(bad)


def test_builtins_load_on_first_lookup_only() -> None:
    reg: Registry[object] = Registry("thing", builtins=("opentela.engines.vllm",))
    assert not reg._loaded
    assert reg.names() == []  # the vllm module registers into ENGINES, not here
    assert reg._loaded


def test_entry_points_register_under_their_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    class FakeEntryPoint:
        def __init__(self, name: str, value: str) -> None:
            self.name, self.value = name, value

        def load(self) -> object:
            module, _, attr = self.value.partition(":")
            return getattr(importlib.import_module(module), attr)

    points = [FakeEntryPoint("Base", "opentela.engines.base:Engine"), FakeEntryPoint("broken", "no.such:X")]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points if group == "g" else [])
    reg: Registry[object] = Registry("thing", entry_point_group="g")
    assert reg.names() == ["base"] and reg.get("base") is Engine  # the broken one is logged and skipped


def test_the_registry_module_sits_below_every_layer() -> None:
    import ast
    from pathlib import Path

    import opentela.plugins

    tree = ast.parse(Path(opentela.plugins.__file__).read_text())
    ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert {m for m in ours if m.startswith("opentela")} == {"opentela.errors"}
