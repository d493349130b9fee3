"""Registry upkeep with an injectable clock: refresh of our own record, collection, and a record gone too old."""

from __future__ import annotations

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry._config import RegistryConfig
from opentela.registry.housekeeping import Housekeeping
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry

CONFIG = RegistryConfig(left_retention=50, tombstone_retention=100, refresh_interval=10)


class Clock:
    def __init__(self) -> None:
        self.now = 5_000.0

    def __call__(self) -> float:
        return self.now


def registry_at(clock: Clock) -> Registry:
    me = Identity.generate()
    first = NodeRecord("s1", me.peer_id, "lab", Lifecycle.SERVING, 1, updated_at=clock.now).signed(me)
    return Registry(me, first, config=CONFIG, clock=clock)


def test_our_record_is_re_signed_before_anyone_would_refuse_it() -> None:
    clock = Clock()
    registry = registry_at(clock)
    keeper = Housekeeping(registry, config=CONFIG)
    clock.now += 9
    keeper.run_once()
    assert registry.local.version == 1, "not yet due"
    clock.now += 2
    keeper.run_once()
    assert registry.local.version == 2 and registry.local.updated_at == clock.now
    assert registry.local.lifecycle is Lifecycle.SERVING


def test_a_node_whose_record_expired_asks_to_rejoin_and_others_are_collected() -> None:
    clock = Clock()
    registry = registry_at(clock)
    other = Identity.generate()
    dead = NodeRecord("s2", other.peer_id, "lab", Lifecycle.LEFT, 3, reason="x", updated_at=clock.now).signed(
        other
    )
    registry.apply_remote([dead])
    expired = []
    keeper = Housekeeping(registry, config=CONFIG, on_expired=lambda: expired.append(True))
    clock.now += 101  # we were paused for longer than any replica keeps a record
    result = keeper.run_once()
    assert expired == [True]
    assert result["compacted"] == 1 and registry.get("s2") is None
    assert registry.local.session_id == "s1", "our own record is never compacted"


def test_a_stopped_node_does_not_refresh() -> None:
    clock = Clock()
    registry = registry_at(clock)
    registry.update_local(lifecycle=Lifecycle.LEFT, reason="shutdown")
    left = registry.local
    clock.now += 20
    Housekeeping(registry, config=CONFIG).run_once()
    assert registry.local == left
