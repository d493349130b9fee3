"""Notices go up once (WARNING) and down once (INFO), keyed by code and subject."""

from __future__ import annotations

import logging

import pytest

from opentela.node.notices import NO_PEERS, Notices


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_notice_is_logged_once_and_keeps_its_time(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    notices = Notices(clock)
    caplog.set_level(logging.INFO, logger="opentela.node.notices")
    assert notices.post(NO_PEERS, "do this")
    clock.now += 5
    assert not notices.post(NO_PEERS, "do this again")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["do this"]
    assert notices.snapshot() == [{"code": NO_PEERS, "subject": "", "message": "do this", "since": 1000.0}]
    assert notices.resolve(NO_PEERS, why="a peer joined") and not notices.resolve(NO_PEERS)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["resolved: no_peers: a peer joined"]
    assert notices.snapshot() == [] and len(notices) == 0


def test_subjects_are_separate_notices_and_resolve_code_takes_all_down() -> None:
    clock = Clock()
    notices = Notices(clock)
    notices.post("bootstrap_unanswered", "a", subject="h:1")
    clock.now += 1
    notices.post("bootstrap_unanswered", "b", subject="h:2")
    notices.post("other", "c")
    assert [n.subject for n in notices.active()] == ["h:1", "h:2", ""]
    assert notices.is_up("bootstrap_unanswered", "h:2") and not notices.is_up("bootstrap_unanswered")
    notices.resolve_code("bootstrap_unanswered")
    assert [n.code for n in notices.active()] == ["other"]
    assert "other" in repr(notices)
