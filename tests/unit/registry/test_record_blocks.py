"""Block spans in a node's record: carried, signed and validated like the rest, absent on other records."""

from __future__ import annotations

import pytest

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry.record import BlockSpan, ModelEntry, NodeRecord

OWNER = Identity.generate()


def record(**kw: object) -> NodeRecord:
    base: dict[str, object] = {
        "session_id": "s1",
        "peer_id": OWNER.peer_id,
        "provider_id": "lab",
        "lifecycle": Lifecycle.SERVING,
        "version": 1,
        "addrs": ("127.0.0.1:1",),
    }
    base.update(kw)
    return NodeRecord(**base).signed(OWNER)  # type: ignore[arg-type]


def test_spans_round_trip_and_are_signed() -> None:
    span = BlockSpan("SmolLM2-135M-Instruct", 10, 20, 30, 256 << 20, 0.42)
    r = record(blocks=(span,))
    back = NodeRecord.from_wire(r.to_wire())
    assert back == r and back.blocks == (span,) and back.verify()
    forged = NodeRecord.from_wire({**r.to_wire(), "blocks": [{**span.to_wire(), "end": 30}]})
    assert not forged.verify()


def test_a_record_without_spans_keeps_its_old_wire_form() -> None:
    r = record(models=(ModelEntry("m", "sim"),))
    assert "blocks" not in r.to_wire()
    assert NodeRecord.from_wire(r.to_wire()).blocks == ()


@pytest.mark.parametrize(
    "bad",
    [
        {"start": 5, "end": 5},
        {"start": 10, "end": 5},
        {"end": 40},
        {"start": -1},
        {"start": 1.5},
        {"model": ""},
        {"model": 7},
        {"cache_bytes": -1},
        {"block_ms": float("nan")},
        {"extra": 1},
    ],
)
def test_malformed_spans_are_refused(bad: dict[str, object]) -> None:
    span = {**BlockSpan("m", 0, 10, 30).to_wire(), **bad}
    with pytest.raises(ValueError):
        NodeRecord.from_wire({**record().to_wire(), "blocks": [span]})


def test_a_tombstone_drops_its_spans() -> None:
    r = record(blocks=(BlockSpan("m", 0, 10, 30),))
    left = r.tombstone().signed(OWNER)
    assert left.blocks == () and NodeRecord.from_wire(left.to_wire()) == left
    with pytest.raises(ValueError, match="tombstone"):
        NodeRecord.from_wire({**left.to_wire(), "blocks": [BlockSpan("m", 0, 10, 30).to_wire()]})
