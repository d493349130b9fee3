"""Round trips from answered probes: a moving average per peer, the smallest sample, nothing from silence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opentela.registry.rtt import RttTable


def test_a_peer_has_no_round_trip_before_its_first_answer() -> None:
    table = RttTable()
    assert table.get("p") is None and table.snapshot() == {}
    table.observe("p", float("nan"))
    table.observe("p", -1.0)
    assert table.get("p") is None


def test_the_average_follows_new_samples_and_the_minimum_keeps_the_best() -> None:
    table = RttTable()
    table.observe("p", 0.010)
    for _ in range(40):
        table.observe("p", 0.002)
    mean = table.get("p")
    assert mean is not None and 0.002 <= mean < 0.0021
    assert table.snapshot()["p"] == {"ms": round(mean * 1000, 3), "min_ms": 2.0, "probes": 41}
    table.forget("p")
    assert table.get("p") is None


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=50))
def test_the_average_stays_within_the_samples(samples: list[float]) -> None:
    table = RttTable()
    for s in samples:
        table.observe("p", s)
    mean = table.get("p")
    assert mean is not None and min(samples) - 1e-9 <= mean <= max(samples) + 1e-9
    assert table.snapshot()["p"]["min_ms"] == round(min(samples) * 1000, 3)
