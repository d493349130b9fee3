"""A node's session in the mesh: who provides it, its first record, a fresh session after an eviction, traces."""

from __future__ import annotations

import dataclasses
import getpass
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentela._types import Lifecycle
from opentela.fabric.identity import Identity
from opentela.registry.record import NodeRecord
from opentela.registry.registry import Registry


def default_provider_id() -> str:
    """user@host, so a provider is named even when the operator did not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "anonymous"
    return f"{user}@{socket.gethostname()}"


def new_session_id() -> str:
    """A fresh, random session id."""
    return uuid.uuid4().hex


def join_record(
    identity: Identity,
    session_id: str,
    provider_id: str,
    *,
    addrs: tuple[str, ...],
    roles: tuple[str, ...],
    hardware: Any,
    now: float | None = None,
) -> NodeRecord:
    """The signed JOIN record a node starts its session with: its hardware and addresses, no models yet."""
    now = time.time() if now is None else now
    return NodeRecord(
        session_id=session_id,
        peer_id=identity.peer_id,
        provider_id=provider_id,
        lifecycle=Lifecycle.JOIN,
        version=1,
        addrs=addrs,
        relays=(),
        roles=roles,
        hardware=hardware,
        models=(),
        started_at=now,
        updated_at=now,
        signer=identity.peer_id,
        reason="",
        signature=b"",
    ).signed(identity)


def resumed_record(
    before: NodeRecord, identity: Identity, session_id: str, now: float | None = None
) -> NodeRecord:
    """`before` carried on under a new session: same state and models, version 1, no reason."""
    now = time.time() if now is None else now
    return dataclasses.replace(
        before, session_id=session_id, version=1, started_at=now, updated_at=now, reason=""
    ).signed(identity)


def trace_applies(registry: Registry, directory: Path, session_id: str) -> Callable[[], None]:
    """Append a line per change applied to this replica (the convergence benchmark reads them); returns close."""
    directory.mkdir(parents=True, exist_ok=True)
    trace = open(directory / f"{session_id}.trace", "a", buffering=1)  # closed by the returned callable

    def write(record: NodeRecord, local: bool) -> None:
        trace.write(
            f"{time.time():.6f} {record.session_id} {record.lifecycle.name} {record.version} {int(local)}\n"
        )

    write(registry.local, True)
    registry.on_change(write)
    return trace.close
