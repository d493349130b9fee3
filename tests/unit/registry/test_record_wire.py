"""Edges of the record schema: the version bound leaves room for evictions, nesting never exhausts the stack,
and the size limit is the receiver's setting."""

from __future__ import annotations

import pytest

from opentela._types import Lifecycle
from opentela.errors import ConfigError
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.record import MAX_VERSION, ModelEntry, NodeRecord
from opentela.registry.registry import Registry

OWNER = Identity.generate()
OTHER = Identity.generate()


def serving(version: int = 1, **kw: object) -> NodeRecord:
    base: dict[str, object] = {
        "session_id": "s1",
        "peer_id": OWNER.peer_id,
        "provider_id": "lab",
        "lifecycle": Lifecycle.SERVING,
        "version": version,
        "addrs": ("127.0.0.1:1",),
        "models": (ModelEntry("m", "sim"),),
    }
    base.update(kw)
    return NodeRecord(**base).signed(OWNER)  # type: ignore[arg-type]


def test_a_live_record_at_the_version_bound_can_still_leave_and_be_evicted() -> None:
    top = serving(MAX_VERSION - 1)
    assert NodeRecord.from_wire(top.to_wire()) == top
    departure = top.tombstone().next(OWNER, lifecycle=Lifecycle.LEFT)
    eviction = top.tombstone(version=top.version + 1, reason="suspected").signed(OTHER)
    for left in (departure, eviction):
        assert left.version == MAX_VERSION
        assert NodeRecord.from_wire(left.to_wire()) == left
    with pytest.raises(ValueError, match="version"):
        NodeRecord.from_wire(serving(MAX_VERSION).to_wire())
    with pytest.raises(ValueError, match="version"):
        NodeRecord.from_wire(departure.tombstone(version=MAX_VERSION + 1).signed(OWNER).to_wire())


@pytest.mark.parametrize("where", ["hardware", "gpu", "cpu", "setting"])
def test_deep_nesting_is_malformed_not_a_crash(where: str) -> None:
    deep: dict[str, object] = {}
    cursor = deep
    for _ in range(505):  # within msgpack's own nesting limit, past Python's recursion limit when walked
        cursor["x"] = {}
        cursor = cursor["x"]  # type: ignore[assignment]
    wire = serving().to_wire()
    if where == "hardware":
        wire["hardware"] = deep
    elif where == "gpu":
        wire["hardware"] = {"gpus": [{"name": "H100", "extra": deep}]}
    elif where == "cpu":
        wire["hardware"] = {"cpu": {"model": "x", "flags": [deep]}}
    else:
        wire["models"] = [{"id": "m", "engine": "sim", "settings": {"context_length": deep}}]
    with pytest.raises(ValueError):
        NodeRecord.from_wire(wire)


def test_the_size_limit_is_the_receivers_setting() -> None:
    big = serving(models=tuple(ModelEntry(f"m{i}", "sim", {"pad": "x" * 200}) for i in range(40)))
    assert NodeRecord.from_wire(big.to_wire())  # about 10 KB: within the default
    me = Identity.generate()
    local = NodeRecord(
        session_id="me", peer_id=me.peer_id, provider_id="lab", lifecycle=Lifecycle.JOIN, version=1
    )
    small = Registry(me, local, config=RegistryConfig(max_record_bytes=4096))
    assert small.apply_wire([big.to_wire()]) == []
    assert small.stats()["rejected_malformed"] == 1
    assert small.apply_wire([serving(session_id="s2").to_wire()])
    with pytest.raises(ConfigError):
        RegistryConfig(max_record_bytes=100)
