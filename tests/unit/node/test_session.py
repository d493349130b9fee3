"""A node's records: the JOIN it starts with, the same state under a fresh session, and its trace lines."""

from __future__ import annotations

from pathlib import Path

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.node.session import join_record, new_session_id, resumed_record, trace_applies
from opentela.registry.record import ModelEntry
from opentela.registry.registry import Registry

ME = Identity.generate()


def test_the_first_record_is_a_signed_join_without_models() -> None:
    record = join_record(
        ME, "s1", "alice@h", addrs=("a:1",), roles=("worker",), hardware={"gpus": []}, now=5.0
    )
    assert record.lifecycle == Lifecycle.JOIN and record.version == 1 and record.models == ()
    assert record.peer_id == ME.peer_id and record.addrs == ("a:1",) and record.started_at == 5.0
    assert record.verify()


def test_a_resumed_record_keeps_state_and_models_under_a_new_session() -> None:
    first = join_record(ME, "s1", "p", addrs=(), roles=("worker",), hardware={})
    serving = first.next(
        ME, lifecycle=Lifecycle.SERVING, models=(ModelEntry(id="m", engine="e"),), reason="x"
    )
    again = resumed_record(serving, ME, "s2", now=9.0)
    assert again.session_id == "s2" and again.version == 1 and again.reason == ""
    assert again.lifecycle == Lifecycle.SERVING and again.model_ids == ("m",) and again.verify()
    assert new_session_id() != new_session_id()


def test_trace_lines_follow_every_change(tmp_path: Path) -> None:
    registry = Registry(ME, join_record(ME, "s1", "p", addrs=(), roles=("worker",), hardware={}))
    close = trace_applies(registry, tmp_path / "trace", "s1")
    registry.update_local(lifecycle=Lifecycle.SERVING)
    close()
    lines = (tmp_path / "trace" / "s1.trace").read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["s1", "JOIN", "1", "1"], ["s1", "SERVING", "2", "1"]]
