"""Plugin registry laws: distinct names round-trip in any case; a name taken twice always raises."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opentela.errors import PluginError
from opentela.plugins import Registry

# Config names are ASCII; some other letters do not survive upper() then lower() ("ß" becomes "ss").
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12)


@given(st.lists(names, unique=True, max_size=20), st.data())
def test_distinct_names_round_trip(keys: list[str], data: st.DataObject) -> None:
    reg: Registry[int] = Registry("thing")
    for i, key in enumerate(keys):
        reg.add(key, i)
    assert reg.names() == keys and len(reg) == len(keys)
    for i, key in enumerate(keys):
        spelled = data.draw(st.sampled_from([key, key.upper(), f" {key} "]))
        assert spelled in reg and reg.get(spelled) == i


@given(st.lists(names, min_size=1, max_size=20), st.data())
def test_a_duplicate_always_raises_and_keeps_the_first(keys: list[str], data: st.DataObject) -> None:
    reg: Registry[int] = Registry("thing")
    for i, key in enumerate(dict.fromkeys(keys)):
        reg.add(key, i)
    before = {key: reg.get(key) for key in reg.names()}
    again = data.draw(st.sampled_from(keys))
    with pytest.raises(PluginError, match="already registered"):
        reg.register(again.upper())(object())
    assert {key: reg.get(key) for key in reg.names()} == before


@given(names, st.lists(names, unique=True, max_size=5))
def test_an_unknown_name_lists_every_known_one(missing: str, keys: list[str]) -> None:
    reg: Registry[int] = Registry("thing")
    for i, key in enumerate(k for k in keys if k != missing):
        reg.add(key, i)
    with pytest.raises(PluginError) as info:
        reg.get(missing)
    assert all(key in str(info.value) for key in reg.names())
