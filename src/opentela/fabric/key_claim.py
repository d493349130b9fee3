"""Which identity key a running node uses: one key per running node, held with a file lock while it runs.

Several nodes started on one machine, or from one home directory shared by a cluster's jobs, would otherwise all
load the same default key and so be one peer to the mesh: a provider bootstrapping to its ingress would dial
itself. Each node therefore claims a key in the configuration directory by taking an exclusive `flock` on a lock
file beside it: `identity.key` for the first node, `identity-2.key`, `identity-3.key`, ... for the next ones. The
lock is released by the operating system when the process ends, however it ends, so a crashed node leaves no stale
claim. A node records which kind of node last used each key (`<key>.owner`, a hash of its role and addresses), and
prefers that key when it is free again: a restarted node gets its previous identity back, and with it its peer id.
A key given explicitly (`--key-file`) is used as it is, even when another running node holds it, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opentela.fabric.identity import Identity

try:  # POSIX only; elsewhere keys are not locked and the first-come default key is used.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

DEFAULT_STEM = "identity"
MAX_KEYS = 1000
"""How many keys one directory may hold before claiming gives up: a guard against a runaway loop."""


@dataclass
class ClaimedKey:
    """An identity key this process holds; the claim lasts until `release()` or the process ends."""

    identity: Identity
    path: Path
    default: bool
    """Whether this is the directory's first key (`identity.key`), the one a lone node uses."""
    shared: bool = False
    """An explicit key that another running node holds too: both are one peer to the mesh."""
    _fd: int | None = None

    def __repr__(self) -> str:
        return f"<ClaimedKey {self.path} {self.identity.peer_id}{' shared' if self.shared else ''}>"

    def release(self) -> None:
        """Give the key back (closing the lock file releases the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def owner_tag(*parts: object) -> str:
    """A short stable tag for the kind of node: equal settings give equal tags."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def key_path(directory: Path, index: int, stem: str = DEFAULT_STEM) -> Path:
    """The path of the `index`-th key of `directory` (1: `identity.key`, 2: `identity-2.key`, ...)."""
    return directory / (f"{stem}.key" if index == 1 else f"{stem}-{index}.key")


def _existing_indices(directory: Path, stem: str) -> list[int]:
    pattern = re.compile(rf"{re.escape(stem)}(?:-([1-9][0-9]*))?\.key")
    found = []
    for entry in directory.glob(f"{stem}*.key"):
        match = pattern.fullmatch(entry.name)
        if match:
            found.append(int(match.group(1) or 1))
    return sorted(found)


def _try_lock(key: Path) -> int | None:
    """An fd holding the exclusive lock of `key`, or None when another process holds it."""
    if fcntl is None:
        return -1
    fd = os.open(key.with_name(key.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _owner_of(key: Path) -> str | None:
    try:
        return key.with_name(key.name + ".owner").read_text().strip() or None
    except OSError:
        return None


def _candidates(directory: Path, stem: str, existing: list[int], owner: str) -> Iterator[int]:
    """Key indices in the order to try: those `owner` used last, the other existing ones, then new ones."""
    mine = [i for i in existing if _owner_of(key_path(directory, i, stem)) == owner]
    yield from mine
    yield from (i for i in existing if i not in mine)
    yield from (i for i in range(1, MAX_KEYS + 1) if i not in existing)


def claim_key(directory: Path, owner: str, *, stem: str = DEFAULT_STEM) -> ClaimedKey:
    """Claim a free key in `directory`: the one `owner` used last if free, else the first free one (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    existing = _existing_indices(directory, stem)
    held: list[str] = []
    for index in _candidates(directory, stem, existing, owner):
        path = key_path(directory, index, stem)
        fd = _try_lock(path)
        if fd is None:
            held.append(path.name)
            continue
        identity = Identity.load_or_create(path)
        path.with_name(path.name + ".owner").write_text(owner + "\n")
        claim = ClaimedKey(identity, path, default=index == 1, _fd=None if fd < 0 else fd)
        logger.info(
            "identity key %s (peer id %s)%s",
            path,
            identity.peer_id,
            f"; held by other nodes running from this directory: {', '.join(held)}" if held else "",
            extra={"key_file": str(path), "peer_id": identity.peer_id},
        )
        return claim
    raise RuntimeError(f"no free identity key among the first {MAX_KEYS} in {directory}")


def claim_explicit(path: Path) -> ClaimedKey:
    """Use the key at `path` (created on first use); warn when another running node holds it too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _try_lock(path)
    identity = Identity.load_or_create(path)
    if fd is None:
        logger.warning(
            "another running node holds %s: both are one peer (%s) to the mesh and will not see each other; "
            "give each node its own --key-file, or leave it out to get a free key automatically",
            path,
            identity.peer_id,
            extra={"key_file": str(path), "peer_id": identity.peer_id},
        )
    return ClaimedKey(identity, path, default=False, shared=fd is None, _fd=None if fd in (None, -1) else fd)
