"""Admission decided in memory: the authority over a SQLite database that this process alone admits against.

With one frontend process per SQLite file (the common single-machine deployment), every admission of every key passes
through this process, so its own memory knows what each key used: the requests and tokens of the last rate window
(an exact sliding window of the requests started in it) and of the key's budget period. Admission checks and reserves
there in one step with no await in between, so on one event loop two requests can never both squeeze under a limit,
and no database round trip is needed. A key's state is loaded from the database the first time it is seen (its
window from the rows of the last minute, its budget from its counter), so a restart picks up where the last run was.

The database stays the truth: every reservation and correction here goes to the database as a usage row change with
the same counter delta (group-committed, frontend/group_commit.py), so the stored counters equal the rows at every
commit whatever happens to this process.

The exclusivity this needs is enforced by a lock file next to the database: a process admitting in memory holds it
exclusively, a process admitting through database transactions holds it shared, and a process that cannot get the lock
it needs refuses to start with the reason. PostgreSQL deployments, which may run several replicas, always admit
through database transactions (frontend/usage.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from opentela.errors import ConfigError
from opentela.frontend.counters import read_counter
from opentela.frontend.db import Database
from opentela.frontend.limits import RATE_WINDOW_S, Consumption
from opentela.frontend.schema import UsageRow

LOCK_SUFFIX = ".admission-lock"


@dataclass(slots=True)
class WindowEntry:
    """One request in a key's rate window: when it started and the tokens counted for it so far."""

    started_at: float
    tokens: int
    in_window: bool = True


@dataclass(slots=True)
class KeyUsage:
    """What one key used, as this process knows it."""

    window: deque[WindowEntry] = field(default_factory=deque)
    window_tokens: int = 0
    budgets: dict[tuple[str, float], list[int]] = field(default_factory=dict)
    """(period, start) -> [requests, tokens] of the budget periods loaded so far."""
    touched_at: float = 0.0
    """When the key's last_used_at was last written."""

    def expire(self, now: float) -> None:
        """Drop the requests that left the rate window."""
        since = now - RATE_WINDOW_S
        while self.window and self.window[0].started_at <= since:
            entry = self.window.popleft()
            entry.in_window = False
            self.window_tokens -= entry.tokens

    def consumption(self, budget: tuple[str, float] | None) -> Consumption:
        """The key's use of its rate window and, given one, of its budget period."""
        p_req, p_tok = self.budgets[budget] if budget is not None else (0, 0)
        oldest = self.window[0].started_at if self.window else None
        return Consumption(len(self.window), self.window_tokens, oldest, p_req, p_tok)


class LocalAdmission:
    """Per-key usage in memory, loaded from the database on first sight (see the module's docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._keys: dict[str, KeyUsage] = {}
        self._loading: dict[object, asyncio.Future[None]] = {}

    def __repr__(self) -> str:
        return f"<LocalAdmission keys={len(self._keys)}>"

    async def usage_of(self, key_id: str, budget: tuple[str, float] | None, now: float) -> KeyUsage:
        """The key's usage with its window and the budget period `budget` loaded."""
        usage = self._keys.get(key_id)
        if usage is None:
            await self._once(key_id, lambda: self._load_window(key_id, now))
            usage = self._keys[key_id]
        if budget is not None and budget not in usage.budgets:
            await self._once((key_id, budget), lambda: self._load_budget(usage, key_id, budget))
        return usage

    async def _once(self, what: object, load: Callable[[], Awaitable[None]]) -> None:
        # Concurrent first requests of one key wait for a single load instead of each loading (and double counting).
        running = self._loading.get(what)
        if running is None:
            running = self._loading[what] = asyncio.ensure_future(load())
            running.add_done_callback(lambda _: self._loading.pop(what, None))
        await asyncio.shield(running)

    async def _load_window(self, key_id: str, now: float) -> None:
        if key_id in self._keys:
            return
        async with self.db.session() as s:
            rows = (
                await s.execute(
                    select(UsageRow.started_at, UsageRow.input_tokens + UsageRow.output_tokens)
                    .where(UsageRow.key_id == key_id, UsageRow.started_at > now - RATE_WINDOW_S)
                    .order_by(UsageRow.started_at)
                )
            ).all()
        usage = KeyUsage()
        for started_at, tokens in rows:
            usage.window.append(WindowEntry(started_at, int(tokens)))
            usage.window_tokens += int(tokens)
        self._keys.setdefault(key_id, usage)

    async def _load_budget(self, usage: KeyUsage, key_id: str, budget: tuple[str, float]) -> None:
        if budget in usage.budgets:
            return
        async with self.db.session() as s:
            requests, tokens = await read_counter(s, key_id, *budget)
        usage.budgets.setdefault(budget, [requests, tokens])
        # Periods that ended are never checked again; their late corrections only go to the database.
        for old in [b for b in usage.budgets if b[0] == budget[0] and b[1] < budget[1]]:
            del usage.budgets[old]

    @staticmethod
    def reserve(usage: KeyUsage, budget: tuple[str, float] | None, now: float, tokens: int) -> WindowEntry:
        """Count an admitted request (one request, its estimated tokens) in the window and the budget."""
        entry = WindowEntry(now, tokens)
        usage.window.append(entry)
        usage.window_tokens += tokens
        if budget is not None:
            spent = usage.budgets[budget]
            spent[0] += 1
            spent[1] += tokens
        return entry

    @staticmethod
    def correct(usage: KeyUsage, entry: WindowEntry, budget: tuple[str, float] | None, tokens: int) -> None:
        """Add `tokens` (possibly negative) to a reserved request's count, as its row was corrected."""
        entry.tokens += tokens
        if entry.in_window:
            usage.window_tokens += tokens
        if budget is not None and budget in usage.budgets:
            usage.budgets[budget][1] += tokens

    @staticmethod
    def release(usage: KeyUsage, entry: WindowEntry, budget: tuple[str, float] | None) -> None:
        """Forget a reserved request whose row never reached the database."""
        if entry.in_window:
            with contextlib.suppress(ValueError):
                usage.window.remove(entry)
                usage.window_tokens -= entry.tokens
            entry.in_window = False
        if budget is not None and budget in usage.budgets:
            usage.budgets[budget][0] -= 1
            usage.budgets[budget][1] -= entry.tokens

    def key_usage(self, key_id: str) -> KeyUsage | None:
        """The loaded usage of a key, if it was seen."""
        return self._keys.get(key_id)


def admission_lock_path(db: Database) -> Path | None:
    """The lock file of a SQLite database file (None for PostgreSQL and in-memory databases)."""
    url = db.engine.url
    if db.dialect != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser().resolve().with_name(Path(url.database).name + LOCK_SUFFIX)


class AdmissionLock:
    """The lock that keeps in-memory admission exclusive to one process per SQLite file."""

    def __init__(self, path: Path, exclusive: bool) -> None:
        self.path, self.exclusive = path, exclusive
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            if exclusive:
                raise ConfigError(
                    f"another frontend is serving the SQLite database next to {path}: in-memory admission needs "
                    "it alone. Stop the other one, give this one its own database (--db), or use PostgreSQL "
                    'for several replicas (or set frontend.admission = "database" on every one of them)'
                ) from None
            raise ConfigError(
                f"a frontend admitting in memory is serving the SQLite database next to {path}; stop it, or "
                "give this one its own database (--db)"
            ) from None
        if exclusive:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, f"{os.getpid()}\n".encode())

    def __repr__(self) -> str:
        return f"<AdmissionLock {self.path} {'exclusive' if self.exclusive else 'shared'}>"

    def release(self) -> None:
        """Let go of the lock (the OS also drops it when the process ends, however it ends)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
