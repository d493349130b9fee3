"""One identity key per running node: claims are exclusive, come back after release, and prefer a node's last key."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opentela.fabric.key_claim import claim_explicit, claim_key, key_path, owner_tag


def test_a_lone_node_uses_the_default_key(tmp_path: Path) -> None:
    claim = claim_key(tmp_path, owner_tag("worker"))
    try:
        assert claim.path == tmp_path / "identity.key" and claim.default and not claim.shared
        assert claim.path.stat().st_mode & 0o777 == 0o600
    finally:
        claim.release()


def test_nodes_running_at_once_get_distinct_keys(tmp_path: Path) -> None:
    claims = [claim_key(tmp_path, owner_tag("worker")) for _ in range(4)]
    try:
        assert [c.path.name for c in claims] == [
            "identity.key",
            "identity-2.key",
            "identity-3.key",
            "identity-4.key",
        ]
        assert len({c.identity.peer_id for c in claims}) == 4
    finally:
        for c in claims:
            c.release()


def test_a_released_key_is_claimed_again_with_the_same_identity(tmp_path: Path) -> None:
    first = claim_key(tmp_path, owner_tag("worker"))
    peer = first.identity.peer_id
    first.release()
    again = claim_key(tmp_path, owner_tag("worker"))
    try:
        assert again.path == first.path and again.identity.peer_id == peer
    finally:
        again.release()


def test_a_restarted_node_gets_its_previous_key_back_when_free(tmp_path: Path) -> None:
    ingress = claim_key(tmp_path, owner_tag("ingress", ":8092"))
    worker = claim_key(tmp_path, owner_tag("worker", "embedded"))
    assert worker.path.name == "identity-2.key"
    worker_peer = worker.identity.peer_id
    ingress.release()
    worker.release()
    # Both stopped; the worker comes back first and still takes its own key, not the free default one.
    back = claim_key(tmp_path, owner_tag("worker", "embedded"))
    ingress_back = claim_key(tmp_path, owner_tag("ingress", ":8092"))
    try:
        assert back.identity.peer_id == worker_peer
        assert ingress_back.path.name == "identity.key"
    finally:
        back.release()
        ingress_back.release()


def test_a_node_whose_previous_key_is_held_takes_the_first_free_one(tmp_path: Path) -> None:
    a = claim_key(tmp_path, owner_tag("same"))
    b = claim_key(tmp_path, owner_tag("same"))
    a.release()
    c = claim_key(
        tmp_path, owner_tag("same")
    )  # prefers both (same settings): identity-2 is held, the default free
    try:
        assert c.path == a.path
    finally:
        b.release()
        c.release()


def test_an_explicit_key_held_elsewhere_is_shared_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "my.key"
    first = claim_explicit(path)
    with caplog.at_level(logging.WARNING, logger="opentela.fabric.key_claim"):
        second = claim_explicit(path)
    try:
        assert not first.shared and second.shared
        assert first.identity.peer_id == second.identity.peer_id
        assert "another running node holds" in caplog.text and "--key-file" in caplog.text
    finally:
        first.release()
        second.release()


def test_other_processes_claim_other_keys(tmp_path: Path) -> None:
    """Processes started at the same moment from one directory never share a key (the lock is the OS's)."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from opentela.fabric.key_claim import claim_key, owner_tag
        claim = claim_key(Path({str(tmp_path)!r}), owner_tag("worker"))
        print(claim.path.name, claim.identity.peer_id, flush=True)
        sys.stdin.read()  # hold the claim until the parent closes our stdin
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        lines = [p.stdout.readline().split() for p in procs if p.stdout is not None]
    finally:
        for p in procs:
            p.communicate(timeout=30)  # closes stdin (the claim ends) and reads stdout to its end
    names = sorted(name for name, _ in lines)
    assert names == ["identity-2.key", "identity-3.key", "identity-4.key", "identity.key"]
    assert len({peer for _, peer in lines}) == 4
    # All ended: the default key is free again.
    claim = claim_key(tmp_path, "someone-else")
    try:
        assert claim.path == key_path(tmp_path, 1)
    finally:
        claim.release()
