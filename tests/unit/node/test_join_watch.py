"""The joining notices with a fake clock: bootstrap to itself, unanswered, joined nobody, an ingress alone."""

from __future__ import annotations

import logging

import pytest

from opentela.errors import HandshakeError, PeerUnreachableError
from opentela.node.join_watch import JoinWatch, is_self_dial
from opentela.node.notices import BOOTSTRAP_SELF, BOOTSTRAP_UNANSWERED, JOINED_NOBODY, NO_PEERS, Notices

OWN = "12D3KooWself@127.0.0.1:4001"
REFUSED = PeerUnreachableError("cannot reach peer at 127.0.0.1:9: connection refused")


def watch(*bootstrap: str, ingress: bool = False, warn: float = 30.0, alone: float = 60.0) -> JoinWatch:
    return JoinWatch(
        Notices(lambda: 0.0),
        ingress=ingress,
        bootstrap=bootstrap,
        own_addr=lambda: OWN,
        warn_after=warn,
        alone_after=alone,
        now=0.0,
    )


def codes(w: JoinWatch) -> list[tuple[str, str]]:
    return [(n.code, n.subject) for n in w.notices.active()]


def test_self_dial_is_recognised() -> None:
    assert is_self_dial(HandshakeError("dialed ourselves", self_dial=True))
    assert not is_self_dial(HandshakeError("bad proof")) and not is_self_dial("12D3KooWpeer")


def test_bootstrapping_to_itself_warns_at_once_and_names_the_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = watch("127.0.0.1:4001")
    caplog.set_level(logging.WARNING, logger="opentela.node.notices")
    w.dialed("127.0.0.1:4001", HandshakeError("dialed ourselves", self_dial=True), now=0.1)
    w.bootstrap_done()
    assert codes(w) == [(BOOTSTRAP_SELF, "127.0.0.1:4001")]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "127.0.0.1:4001 is this very node" in line and "--key-file" in line
    # Nobody joined either: after the threshold that is said too, with the address marked as ourselves.
    w.observe(0, now=29.0)
    assert len(codes(w)) == 1
    w.observe(0, now=30.0)
    joined = next(n for n in w.notices.active() if n.code == JOINED_NOBODY)
    assert "joined no peer" in joined.message and "127.0.0.1:4001 (this node itself)" in joined.message


def test_a_seed_list_naming_this_node_too_is_not_a_warning() -> None:
    w = watch("127.0.0.1:4001", "127.0.0.1:4002")
    w.dialed("127.0.0.1:4001", HandshakeError("dialed ourselves", self_dial=True), now=0.1)
    w.dialed("127.0.0.1:4002", "12D3KooWpeer", now=0.1)
    w.bootstrap_done()
    w.observe(1, now=100.0)
    assert codes(w) == []


def test_an_unanswered_bootstrap_warns_after_the_threshold_once_and_clears_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = watch("127.0.0.1:9", warn=5.0)
    caplog.set_level(logging.INFO, logger="opentela.node.notices")
    for t in (0.0, 1.0, 3.0):
        w.dialed("127.0.0.1:9", REFUSED, now=t)
        w.observe(0, now=t)
    assert codes(w) == []
    w.observe(0, now=5.0)
    assert codes(w) == [(BOOTSTRAP_UNANSWERED, "127.0.0.1:9"), (JOINED_NOBODY, "")]
    unanswered = w.notices.active()[0].message
    assert "has not answered for 5 s" in unanswered and "connection refused" in unanswered
    assert "--listen" in unanswered and "firewall" in unanswered
    for t in (7.0, 15.0):
        w.dialed("127.0.0.1:9", REFUSED, now=t)
        w.observe(0, now=t)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # once each, not on every retry
    w.dialed("127.0.0.1:9", "12D3KooWpeer", now=16.0)
    w.bootstrap_done()
    w.observe(1, now=17.0)
    assert codes(w) == []
    assert sum(r.levelno == logging.INFO for r in caplog.records) == 2


def test_bootstrap_done_stops_the_unanswered_check() -> None:
    w = watch("127.0.0.1:9", "127.0.0.1:10", warn=5.0)
    w.dialed("127.0.0.1:9", REFUSED, now=0.0)
    w.dialed("127.0.0.1:10", "12D3KooWpeer", now=0.0)
    w.bootstrap_done()
    w.observe(1, now=60.0)
    assert codes(w) == []


def test_a_worker_without_bootstrap_warns_at_start_and_clears_when_a_peer_joins() -> None:
    w = watch()
    w.observe(0, now=0.0)
    assert codes(w) == [(JOINED_NOBODY, "")]
    assert "without --bootstrap" in w.notices.active()[0].message and OWN in w.notices.active()[0].message
    w.observe(1, now=2.0)
    assert codes(w) == []


def test_an_ingress_alone_warns_after_its_threshold_with_its_bootstrap_address() -> None:
    w = watch(ingress=True, alone=60.0)
    w.observe(0, now=59.0)
    assert codes(w) == []
    w.observe(0, now=60.0)
    assert codes(w) == [(NO_PEERS, "")]
    assert f"otela start --bootstrap {OWN}" in w.notices.active()[0].message
    w.observe(2, now=61.0)
    assert codes(w) == []
    # Alone again (every provider left): the clock starts over.
    w.observe(0, now=70.0)
    w.observe(0, now=129.0)
    assert codes(w) == []
    w.observe(0, now=130.0)
    assert codes(w) == [(NO_PEERS, "")]


def test_an_ingress_running_an_engine_itself_is_never_short_of_peers() -> None:
    w = watch(ingress=True, alone=1.0)
    w.observe(0, now=100.0, has_engine=True)
    assert codes(w) == []


def test_zero_turns_the_checks_off_and_the_interval_follows_the_thresholds() -> None:
    w = watch("127.0.0.1:9", warn=0.0)
    w.dialed("127.0.0.1:9", REFUSED, now=0.0)
    w.observe(0, now=1e6)
    assert codes(w) == []
    assert watch(warn=0.0, alone=0.0).check_interval == 1.0
    assert watch(warn=0.4).check_interval == pytest.approx(0.1)
    assert watch(warn=0.01).check_interval == 0.05
